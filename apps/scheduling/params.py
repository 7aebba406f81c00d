"""What a job kind's parameters are, said once: the form's fields, and names instead of ids.

A job that acts on an object (drain a member, scale a pool region, run a capacity test) stores that object's
id. A person never types one: each kind declares its parameters (`Param`), the jobs form draws a picker for
each reference and an input of the right type for the rest, and a reference may be given by its name
(`member: web/api/m1`) wherever the API takes params. The export writes names, so a config document holds no
ids (apps.configcode), and applying it resolves the names in the org's own scope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.core.errors import DomainError
from apps.core.tenancy import Action, restricted


@dataclass(frozen=True)
class RefType:
    """A kind of object a job names: how to list, name and find one (in a principal's scope)."""

    model: Callable[[], Any]  # the model class, imported when first needed (scheduling sits above these apps)
    related: tuple[str, ...]
    describe: Callable[[Any], str]
    lookup: Callable[[str], dict[str, Any] | None]  # a name -> filter kwargs, None when it is not one's shape
    shape: str  # how the name is written, for messages


def _split(value: str, parts: int) -> list[str] | None:
    items = value.split("/")
    return items if len(items) == parts and all(items) else None


def _model(path: str) -> Callable[[], Any]:
    def load() -> Any:
        from django.apps import apps

        return apps.get_model(path)

    return load


REFS: dict[str, RefType] = {
    "member": RefType(_model("balancers.Member"), ("pool__lb",),
                      lambda m: f"{m.pool.lb.name}/{m.pool.name}/{m.name}",
                      lambda v: (p := _split(v, 3)) and {"pool__lb__name": p[0], "pool__name": p[1], "name": p[2]},
                      "lb/pool/member"),
    "pool_region": RefType(_model("balancers.PoolRegion"), ("pool__lb", "region"),
                           lambda r: f"{r.pool.lb.name}/{r.pool.name}/{r.region.slug}",
                           lambda v: (p := _split(v, 3))
                           and {"pool__lb__name": p[0], "pool__name": p[1], "region__slug": p[2]},
                           "lb/pool/region"),
    "capacity_test": RefType(_model("capacity.CapacityTest"), (), lambda t: t.name,
                             lambda v: {"name": v}, "test name"),
    "fleet": RefType(_model("fleets.Fleet"), (), lambda f: f.name, lambda v: {"name": v}, "fleet name"),
    "cloud_target": RefType(_model("cloud.CloudTarget"), (), lambda t: t.name, lambda v: {"name": v},
                            "target name"),
    "load_balancer": RefType(_model("balancers.LoadBalancer"), (), lambda b: b.name, lambda v: {"name": v},
                             "load balancer name"),
}


@dataclass(frozen=True)
class Param:
    """One parameter of a job kind. `kind`: ref, int, number, bool, choice, text or url."""

    name: str
    label: str
    kind: str
    ref: str = ""  # a REFS key, for kind "ref"
    choices: tuple[str, ...] = ()
    default: Any = None
    required: bool = False
    help: str = ""
    options: list[tuple[Any, str]] = field(default_factory=list, compare=False)  # filled per request (pickers)


def options(param: Param, principal: Any) -> list[tuple[int, str]]:
    """(id, name) of every object the principal may pick for a reference parameter, by name."""
    ref = REFS[param.ref]
    qs = restricted(ref.model(), principal, Action.USE)
    if ref.related:
        qs = qs.select_related(*ref.related)
    return sorted(((obj.pk, ref.describe(obj)) for obj in qs[:2000]), key=lambda item: item[1])


def resolve_names(params: dict[str, Any], declared: tuple[Param, ...], principal: Any) -> dict[str, Any]:
    """`params` with every reference given by name replaced by its id, found in the principal's scope (the job's
    org: a name of another tenant's object answers like a missing one)."""
    out = dict(params)
    for param in declared:
        value = out.get(param.name)
        if param.kind != "ref" or not isinstance(value, str):
            continue
        ref = REFS[param.ref]
        lookup = ref.lookup(value)
        found = restricted(ref.model(), principal, Action.USE).filter(**lookup).first() if lookup else None
        if found is None:
            raise DomainError("invalid_params", f"No {param.label.lower()} named {value!r} (written "
                              f"{ref.shape}).", field=f"params.{param.name}")
        out[param.name] = found.pk
    return out


def to_names(params: dict[str, Any], declared: tuple[Param, ...]) -> dict[str, Any]:
    """`params` with every reference id replaced by the object's name (the export's id-free form)."""
    out = dict(params)
    for param in declared:
        value = out.get(param.name)
        if param.kind != "ref" or isinstance(value, bool) or not isinstance(value, int):
            continue
        ref = REFS[param.ref]
        qs = ref.model().objects.filter(pk=value)
        if ref.related:
            qs = qs.select_related(*ref.related)
        obj = qs.first()
        if obj is not None:
            out[param.name] = ref.describe(obj)
    return out
