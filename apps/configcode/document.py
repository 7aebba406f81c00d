"""Config as code, the pure part: canonical documents, their version tag, and the plan between two.

A document lists an org's objects per kind, each identified by names (never database ids):

    {"version": 1, "org": "acme", "etag": "...",
     "load_balancers": [{"name": ...}], "listeners": [{"lb": ..., "name": ...}], "pools": [...],
     "pool_regions": [...], "members": [...], "routes": [...], "capacity_tests": [...], "jobs": [...]}

Invariant: `canonical(d)` is idempotent, orders every list by its key and every mapping by name, and
maps equal values to equal JSON (1 and 1.0, ["b","a"] hosts in stored order), so `plan(canonical(export),
canonical(export))` is empty and a plan on unchanged input is always empty — no phantom drift.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final

VERSION: Final = 1
# kind: key fields, in dependency order (creates run in this order, deletes in reverse).
KINDS: Final[dict[str, tuple[str, ...]]] = {
    "load_balancers": ("name",),
    "pools": ("lb", "name"),
    "pool_regions": ("lb", "pool", "region"),
    "members": ("lb", "pool", "name"),
    "listeners": ("lb", "name"),
    "routes": ("lb", "priority"),
    "capacity_tests": ("name",),
    "jobs": ("name",),
}
EXPORT_ONLY: Final[tuple[str, ...]] = ()
# Fields that name other rows, and the shape each name must have ("lb/name" is a name on a load balancer).
# The planner and the resolver read these; every other field goes to the API's serializer as it is.
REFERENCES: Final[dict[str, dict[str, str]]] = {
    "listeners": {"default_pool": "name", "certificate": "name"},
    "capacity_tests": {"listener": "lb/name", "route": "lb/priority", "pool": "lb/name", "region": "name"},
}


class DocumentError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _value(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def key_of(kind: str, obj: dict[str, Any]) -> tuple:
    return tuple(str(obj.get(k)) for k in KINDS.get(kind, ("name",)))


def canonical(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise DocumentError("invalid_document", "The document must be a mapping.")
    if doc.get("version", VERSION) != VERSION:
        raise DocumentError("unsupported_version", f"Only version {VERSION} documents are understood.")
    unknown = set(doc) - set(KINDS) - set(EXPORT_ONLY) - {"version", "org", "etag"}
    if unknown:
        raise DocumentError("invalid_document", f"Unknown sections: {', '.join(sorted(unknown))}.")
    out: dict[str, Any] = {"version": VERSION}
    for kind in (*KINDS, *EXPORT_ONLY):
        items = doc.get(kind) or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise DocumentError("invalid_document", f"{kind} must be a list of mappings.")
        rows = [_value(i) for i in items]
        for row in rows:
            _check_row(kind, row)
        if kind == "routes":
            for row in rows:
                row["targets"] = sorted(row.get("targets") or [], key=lambda t: str(t.get("pool")))
        keys = [key_of(kind, r) for r in rows]
        if len(set(keys)) != len(keys):
            names = "/".join(KINDS.get(kind, ("name",)))
            raise DocumentError("duplicate_key", f"{kind} has two entries with the same {names}.")
        out[kind] = sorted(rows, key=lambda r: key_of(kind, r))
    return out


def _check_row(kind: str, row: dict[str, Any]) -> None:
    """A row's keys and references have the shapes the planner relies on (else a clear invalid_document)."""
    where = f"{kind} entry"
    for key in KINDS[kind]:
        value = row.get(key)
        if key == "priority":
            if isinstance(value, bool) or not isinstance(value, int):
                raise DocumentError("invalid_document", f"Each {where} needs a whole-number priority.")
        elif not isinstance(value, str) or not value:
            raise DocumentError("invalid_document", f"Each {where} needs {key!r} as a non-empty name.")
    for name, shape in REFERENCES.get(kind, {}).items():
        value = row.get(name)
        if value is None:
            continue
        parts = value.split("/", 1) if isinstance(value, str) else []
        if shape == "name" and not (isinstance(value, str) and value):
            raise DocumentError("invalid_document", f"{where} {row.get('name')!r}: {name} must be a name.")
        if shape.startswith("lb/") and not (len(parts) == 2 and all(parts)):
            raise DocumentError("invalid_document", f"{where} {row.get('name')!r}: {name} must be written "
                                f"{shape!r} (for example 'web/{'10' if shape.endswith('priority') else 'api'}').")
    if kind == "routes":
        targets = row.get("targets")
        if targets is not None and not (isinstance(targets, list) and all(
                isinstance(t, dict) and isinstance(t.get("pool"), str) and t["pool"] for t in targets)):
            raise DocumentError("invalid_document", f"route {row.get('lb')}/{row.get('priority')}: targets must be "
                                "a list of mappings, each with a pool name (and a weight).")


def etag(doc: dict[str, Any]) -> str:
    """Version tag of a canonical document's content (the org and etag fields left out)."""
    content = {k: v for k, v in doc.items() if k not in ("org", "etag")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


@dataclass
class Change:
    action: str  # create | update | delete
    kind: str
    key: dict[str, Any]
    side: str  # "missing in Spillway" (create), "missing in the file" (delete), "both differ" (update)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)  # name: {"spillway": v, "file": v}
    desired: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "kind": self.kind, "key": self.key, "side": self.side, "fields": self.fields}


def plan(current: dict[str, Any], desired: dict[str, Any]) -> list[Change]:
    """What applying `desired` (the file) to `current` (Spillway) changes; both canonical."""
    changes: list[Change] = []
    for kind, key_fields in KINDS.items():
        have = {key_of(kind, r): r for r in current.get(kind, [])}
        want = {key_of(kind, r): r for r in desired.get(kind, [])}
        for key in sorted(set(have) | set(want)):
            ident = dict(zip(key_fields, key, strict=True))
            if key not in have:
                changes.append(Change("create", kind, ident, "missing in Spillway",
                                      {f: {"spillway": None, "file": v} for f, v in want[key].items()
                                       if f not in key_fields}, want[key]))
            elif key not in want:
                changes.append(Change("delete", kind, ident, "missing in the file",
                                      {f: {"spillway": v, "file": None} for f, v in have[key].items()
                                       if f not in key_fields}))
            else:
                # Fields the file leaves out keep their value (a partial file is not a delete of fields).
                diff = {f: {"spillway": have[key].get(f), "file": v} for f, v in want[key].items()
                        if f not in key_fields and have[key].get(f) != v}
                if diff:
                    changes.append(Change("update", kind, ident, "both differ", diff, want[key]))
    order = list(KINDS)
    creates = [c for c in changes if c.action != "delete"]
    deletes = sorted((c for c in changes if c.action == "delete"), key=lambda c: -order.index(c.kind))
    # Creates and updates first (a route moves to its new pool before the old pool goes), then deletes.
    return sorted(creates, key=lambda c: order.index(c.kind)) + deletes
