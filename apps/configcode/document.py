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
        if kind == "routes":
            for row in rows:
                row["targets"] = sorted(row.get("targets") or [], key=lambda t: str(t.get("pool")))
        keys = [key_of(kind, r) for r in rows]
        if len(set(keys)) != len(keys):
            names = "/".join(KINDS.get(kind, ("name",)))
            raise DocumentError("duplicate_key", f"{kind} has two entries with the same {names}.")
        out[kind] = sorted(rows, key=lambda r: key_of(kind, r))
    return out


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
