"""Find each Spillway app's contribution modules (API routes, UI pages, periodic tasks, demo data).

One loop over INSTALLED_APPS (Django's app registry, in its order) replaces the hand-kept app lists
that each consumer had: a new app contributes by having the module, nothing else to edit.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from types import ModuleType

from django.apps import apps
from django.utils.module_loading import module_has_submodule


def app_modules(submodule: str) -> Iterator[ModuleType]:
    """`apps.<app>.<submodule>` of every installed Spillway app that has one, in INSTALLED_APPS order."""
    for config in apps.get_app_configs():
        if not config.name.startswith("apps."):
            continue
        package = config.module
        head, _, rest = submodule.partition(".")
        if not module_has_submodule(package, head):
            continue
        if rest and not module_has_submodule(import_module(f"{config.name}.{head}"), rest):
            continue
        yield import_module(f"{config.name}.{submodule}")
