"""Entry point of the synthesis layer: CloudLB in, Terraform JSON out.

The rest of Spillway calls only `synthesize` (and `warm` at worker start) and deals only in the
synthesized Terraform JSON, so terraform-cdk (unmaintained upstream since December 2025, pinned in
requirements-cloud.txt) can be replaced behind this module.

Cost model, measured on the 2-core dev machine: loading a prebuilt provider costs seconds per process
(the jsii node process loads the provider's 37 MB assembly and holds ~0.5 GB per provider; the first run
ever also unpacks ~780 MB into the package cache), a synthesis then takes a fraction of a second. So a
long-lived worker calls `warm()` once at start; never import per request.

jsii never releases what it sent to its node process: each synthesis leaves its constructs there (about
1 MB of node RSS per synthesis of a 100-route LB, measured by bench_synth). A worker should therefore be
recycled after some hundreds of syntheses (`synthesis_count()`, or Celery's worker_max_tasks_per_child).

The prebuilt provider packages import every one of their submodules from their `__init__` (2,212 for
aws): about 0.5 GB of Python objects per provider and most of the import time, for a dozen classes used
here. `_register_bare_package` puts an empty package object in sys.modules first, so only the submodules
the stacks name are imported; the synthesized JSON was compared byte for byte with a full import.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deploy.limits import AWS_RULES_PER_ALB, LimitError, check_limits
from deploy.model import CloudLB, Provider

REPO_ROOT = Path(__file__).resolve().parent.parent

_ENV_DEFAULTS = {
    # terraform-cdk phones home for version checks unless told not to; Spillway runs offline.
    "CHECKPOINT_DISABLE": "1",
    # jsii unpacks each provider (hundreds of MB) into a package cache, by default under the user's home;
    # keeping it in the project (git-ignored) makes it visible and removable with the checkout.
    "JSII_RUNTIME_PACKAGE_CACHE_ROOT": str(REPO_ROOT / ".jsii-cache"),
    # Node 20 is past jsii's support date; jsii prints a 7-line banner on every process start. Node 20 is
    # what this machine has and synthesis works on it; install node 22 to drop this line.
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
}

_STACK_MODULES: dict[str, tuple[str, str]] = {
    "gcp": ("deploy.gcp", "GcpLoadBalancerStack"),
    "aws": ("deploy.aws", "AwsLoadBalancerStack"),
}
_PROVIDER_PACKAGES: dict[str, str] = {
    "gcp": "cdktn_provider_google",
    "aws": "cdktn_provider_aws",
}

# jsii talks to one node child process over a pipe; concurrent calls from threads are not supported.
_lock = threading.Lock()
_count = [0]


def synthesis_count() -> int:
    """Syntheses run by this process (see the note on memory above)."""
    return _count[0]


def prepare_environment() -> None:
    """Set the environment jsii reads when its node process starts (a user's own values win)."""
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def _register_bare_package(name: str) -> None:
    """Make `import name.sub` skip `name/__init__.py` (which imports every submodule of the provider)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed: the stack module's own import raises the ModuleNotFoundError
    sys.modules[name] = importlib.util.module_from_spec(spec)


def warm(providers: tuple[Provider, ...] = ("gcp", "aws")) -> float:
    """Load cdktn (CDK Terrain) and the given providers into this process; returns the seconds it took (~0 if done)."""
    prepare_environment()
    started = time.perf_counter()
    with _lock:
        for provider in providers:
            _register_bare_package(_PROVIDER_PACKAGES[provider])
            importlib.import_module(_STACK_MODULES[provider][0])
    return time.perf_counter() - started


def synthesize(lb: CloudLB, outdir: str | os.PathLike[str], *,
               aws_rules_per_alb: int = AWS_RULES_PER_ALB) -> dict[str, Any]:
    """Synthesize `lb` into `outdir` and return the stack's Terraform JSON as a dict.

    Raises LimitError, before touching cdktn, when check_limits finds anything. `outdir` receives the
    usual cdktf/cdktn layout (manifest.json, stacks/<lb.name>/cdk.tf.json), ready for `terraform init/plan`
    in that stack directory. `aws_rules_per_alb` is the account's raised quota, if any.
    """
    violations = check_limits(lb, aws_rules_per_alb=aws_rules_per_alb)
    if violations:
        raise LimitError(violations)
    warm((lb.provider,))
    from cdktn import App

    module_name, class_name = _STACK_MODULES[lb.provider]
    stack_class = getattr(importlib.import_module(module_name), class_name)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)  # cdktn creates only the last directory level
    with _lock:
        app = App(outdir=str(out))
        stack_class(app, lb)
        app.synth()
        _count[0] += 1
    return json.loads((out / "stacks" / lb.name / "cdk.tf.json").read_text())
