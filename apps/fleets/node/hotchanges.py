"""Which differences between two bundles a running worker can take through the runtime API, with no reload:
map contents, certificate contents and servers' admin state or weight (no Django)."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.fleets.config.spec import MAIN_FILE, ConfigBundle


@dataclass(frozen=True)
class HotChanges:
    maps: dict[str, list[tuple[str, str]]]
    certs: dict[str, bytes]
    # (backend, server) -> (admin state, weight): members drained, put in maintenance, made ready or re-weighted
    servers: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)


def _server_changes(old: ConfigBundle, new: ConfigBundle) -> dict[tuple[str, str], tuple[str, int]] | None:
    """The servers whose admin state or weight is all that differs between the two haproxy.cfg bodies, or None
    when anything else differs. The manifests say which line each server is on and what it stands for."""
    if old.body == new.body:
        return {}
    before = old.manifest.servers if old.manifest is not None else None
    after = new.rendered_manifest.servers
    if before is None or before.keys() != after.keys():
        return None
    moved = {key for key, wanted in after.items() if wanted[:2] != before[key][:2]}
    if any(before[key][2] != after[key][2] for key in moved):
        return None
    old_lines, new_lines = old.body.split("\n"), new.body.split("\n")
    if len(old_lines) != len(new_lines):
        return None
    lines = {after[key][2] for key in moved}
    if any(a != b and n not in lines for n, (a, b) in enumerate(zip(old_lines, new_lines, strict=True))):
        return None
    return {key: after[key][:2] for key in moved}


def hot_changes(old: ConfigBundle, new: ConfigBundle) -> HotChanges | None:
    """What to change in a running worker when `new` differs from `old` only in maps, certificates and the
    admin state or weight of servers.

    Then a node running `old` can take `new` through the runtime API with no reload: same file names, the
    same haproxy.cfg apart from its header comments and server lines' weights and `disabled` (a member drained,
    put in maintenance or re-weighted: `set server`), only `maps/*.map` contents (route changes,
    frontends.classify_with_maps) and `certs/*.pem` contents (a renewed or replaced certificate: `set/commit
    ssl cert`) moved. Else None.
    """
    if old.files.keys() != new.files.keys():
        return None
    servers = _server_changes(old, new)
    if servers is None:
        return None
    maps, certs = {}, {}
    wanted = new.rendered_manifest.maps
    for name, content in new.files.items():
        if name == MAIN_FILE or old.files[name] == content:
            continue
        if name in wanted:
            maps[name] = wanted[name]
        elif name.startswith("certs/") and name.endswith(".pem"):
            certs[name] = content
        else:
            return None
    return HotChanges(maps, certs, servers)


def hot_map_changes(old: ConfigBundle, new: ConfigBundle) -> dict[str, list[tuple[str, str]]] | None:
    """hot_changes limited to maps: None also when a certificate or a server changed."""
    changes = hot_changes(old, new)
    return changes.maps if changes is not None and not changes.certs and not changes.servers else None
