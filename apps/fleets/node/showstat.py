"""`show stat` answers read by header name: every row (`parse_show_stat`), or only whether each backend has a
server to send to and how many active ones (`parse_backends`, what the enforcement loop needs four times a
second); and the rows of `show table` (`parse_show_table`, `parse_show_table_counts`).

Pure Python, no Django. HAProxy 2.6 prints one CSV line per proxy and server after a `# ` header; a field is
quoted only when it holds a comma or a quote (a check's text).
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from apps.core.gcpause import collector_paused


def int_or_none(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class StatRow:
    """One line of ``show stat``; numeric fields are None where HAProxy leaves them empty."""

    pxname: str
    svname: str
    type: int  # 0 frontend, 1 backend, 2 server, 3 listener
    scur: int | None
    slim: int | None
    status: str
    weight: int | None
    rate: int | None  # per second; requests/s for HTTP backends and servers
    check_status: str
    check_code: int | None
    req_rate: int | None  # frontends only
    req_tot: int | None
    raw: Mapping[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def is_server(self) -> bool:
        return self.type == 2


class _Columns(Mapping[str, str]):
    """One row's columns by header name, read from its values when asked: with the split below, this took the
    parse of 60k rows (20k pools) from 650-680 ms to 480-500 ms, where a dict of ~100 columns was built per row."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: Mapping[str, int], values: list[str]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, name: str) -> str:
        at = self._index[name]
        if at >= len(self._values):
            raise KeyError(name)
        return self._values[at]

    def __iter__(self) -> Iterator[str]:
        return (name for name, at in self._index.items() if at < len(self._values))

    def __len__(self) -> int:
        return min(len(self._index), len(self._values))


def parse_show_stat(text: str) -> list[StatRow]:
    """Parse ``show stat`` CSV by header name, so new columns in later versions don't shift us."""
    # The collector would rescan the worker's heap for the three acyclic objects a row allocates (at 60k rows:
    # 780-1200 ms with it, 370 ms without, measured on 20k pools' rows).
    with collector_paused():
        return _parse_show_stat(text)


def _header(text: str) -> tuple[list[str], Mapping[str, int]]:
    """The answer's lines and its columns' positions by name (the `# ` header line)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not a show stat answer: {text[:200]!r}")
    return lines, _columns(lines[0])


@functools.lru_cache(maxsize=8)
def _columns(header: str) -> Mapping[str, int]:
    """A header line's columns by name, read-only: every answer of one HAProxy version has the same header, and
    building this for each answer was a twentieth of the enforcement loop (every node, four times a second)."""
    return MappingProxyType({name: at for at, name in enumerate(header[2:].split(","))})


def _parse_show_stat(text: str) -> list[StatRow]:
    lines, index = _header(text)

    def column(name: str) -> Callable[[list[str]], str]:
        at = index.get(name)
        if at is None:  # a column this HAProxy does not print
            return lambda values: ""
        return lambda values: values[at] if at < len(values) else ""

    px, sv, kind, scur, slim, status, weight, rate, check_status, check_code, req_rate, req_tot = (
        column(name) for name in ("pxname", "svname", "type", "scur", "slim", "status", "weight", "rate",
                                  "check_status", "check_code", "req_rate", "req_tot"))
    rows: list[StatRow] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        # HAProxy quotes a field only when it holds a comma or a quote (a check's text): a line without a quote
        # splits on commas exactly as the csv module reads it, without its per-line reader.
        values = line.split(",") if '"' not in line else next(csv.reader([line]))
        rows.append(
            StatRow(
                pxname=px(values),
                svname=sv(values),
                type=int_or_none(kind(values)) or 0,
                scur=int_or_none(scur(values)),
                slim=int_or_none(slim(values)),
                status=status(values),
                weight=int_or_none(weight(values)),
                rate=int_or_none(rate(values)),
                check_status=check_status(values),
                check_code=int_or_none(check_code(values)),
                req_rate=int_or_none(req_rate(values)),
                req_tot=int_or_none(req_tot(values)),
                raw=_Columns(index, values),
            )
        )
    return rows


def parse_backends(text: str) -> tuple[dict[str, bool], dict[str, int]]:
    """({backend: whether it has a server to send to}, {backend: its count of usable active servers}) from the
    BACKEND rows of a `show stat` answer (ask for `show stat -1 2 -1`, the backends' rows alone), each row split once.
    Only the columns up to `status`, `act` and `bck` are split off each line: the enforcement loop reads this from
    every node four times a second, and a full parse of every row would not fit at thousands of pools.

    Usable is status UP with at least one usable server (`act` + `bck`): HAProxy 2.6 reports a backend without
    any server as UP (a pool's region before its first member), which no request should be sent to. The active
    count (`act`) is a region's healthy share of members as this node sees it, for failover and auto capacity
    drain (apps.traffic.steering)."""
    rows = _backend_rows(text)
    return ({px: backend_usable(status, act, bck) for px, status, act, bck in rows},
            {px: int_or_none(act) or 0 for px, _, act, _ in rows})


def _backend_rows(text: str) -> list[tuple[str, str, str, str]]:
    lines, index = _header(text)
    wanted = ("pxname", "svname", "status", "act", "bck")
    if missing := [name for name in wanted if name not in index]:
        raise ValueError(f"show stat header lacks {', '.join(missing)}: {lines[0][:200]!r}")
    px, sv, st, act, bck = (index[name] for name in wanted)
    split_at = max(px, sv, st, act, bck) + 1
    rows = []
    for line in lines[1:]:
        values = line.split(",", split_at) if '"' not in line else next(csv.reader([line]))
        if len(values) > split_at - 1 and values[sv] == "BACKEND":
            rows.append((values[px], values[st], values[act], values[bck]))
    return rows


def backend_usable(status: str, act: str, bck: str) -> bool:
    """A BACKEND row's status and its counts of usable active and backup servers (parse_backends)."""
    return status == "UP" and (int_or_none(act) or 0) + (int_or_none(bck) or 0) > 0


_ROW_RE = re.compile(r"key=(\S+) .*?http_req_rate\(\d+\)=(\d+)")
_CNT_RE = re.compile(r"key=(\S+) .*?http_req_cnt=(\d+)")


def parse_show_table(text: str) -> dict[str, float]:
    """`show table <t>` rows -> {key: http_req_rate}."""
    return {m.group(1): float(m.group(2)) for m in _ROW_RE.finditer(text)}


_GPC0_RE = re.compile(r"key=(\S+) .*?gpc0=(\d+)")


def parse_show_table_counts(text: str) -> dict[str, int]:
    """`show table <t>` rows -> {key: http_req_cnt} (rows of a table that stores it)."""
    return {m.group(1): int(m.group(2)) for m in _CNT_RE.finditer(text)}


def parse_show_table_gpc0(text: str) -> dict[str, int]:
    """`show table <t>` rows -> {key: gpc0} (rows of a table that stores it)."""
    return {m.group(1): int(m.group(2)) for m in _GPC0_RE.finditer(text)}
