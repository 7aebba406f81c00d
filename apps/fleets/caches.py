"""Every per-process cache of fleets, registered in one place: one reset, one view of what each holds.

Each module keeps its cache where it is used (a lookup there is a dict access), but makes it through
`register`, so a test or an operator's debugging session finds them all here instead of in a dozen modules.
No Django: the renderer and node modules register theirs too.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar


class _Clearable(Protocol):
    def clear(self) -> None: ...
    def __len__(self) -> int: ...


C = TypeVar("C", bound=_Clearable)

_REGISTRY: dict[str, Any] = {}


def register(name: str, cache: C) -> C:
    """Keep `cache` (a dict, OrderedDict or set) under `name`; returns it, for `_X = register("x", {})`."""
    if name in _REGISTRY and _REGISTRY[name] is not cache:
        raise ValueError(f"a fleets cache named {name!r} is registered already")
    _REGISTRY[name] = cache
    return cache


def reset(*names: str) -> None:
    """Empty the named caches, or all of them: the next use reads or renders afresh (always safe)."""
    for name in names or tuple(_REGISTRY):
        _REGISTRY[name].clear()


def sizes() -> dict[str, int]:
    """Entries held per cache, by name."""
    return {name: len(cache) for name, cache in sorted(_REGISTRY.items())}
