"""Fixed-shape ORM queries compiled once per database, then run with new values.

Django builds and compiles a queryset's SQL on every evaluation: for the API token lookup (select_related, an
annotation, an OR of expiry conditions) that is ~1.5 ms of CPU on every API call (tests/bench/bench_prepared.py),
several times the query's own round trip. A `PreparedQuery` is written as an ordinary queryset, built from named
values; it is compiled twice with two probe values per name, and the parameters that differ are the named slots:
every other parameter is part of the query's shape, whatever the values. Each call then runs that SQL with the
call's values and builds the model instances as Django's ModelIterable does (select_related objects and annotations
included).

Only where the compiled parameters are the values as given (PostgreSQL; SQLite adapts datetimes to text) and
only for values of the probes' types (None would change the SQL's shape: `IS NULL`): anything else runs the
queryset as Django would.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators
from django.db.models.sql.compiler import SQLCompiler

logger = logging.getLogger(__name__)


class NotPreparable(Exception):
    """The query's values cannot be told apart from its shape in the compiled parameters."""


class PreparedQuery:
    """A queryset `build(**values)` of one shape whatever the values, compiled once per database.

    Only the named values change from call to call: anything else the build reads (the clock, a setting, a
    context variable) is frozen at the first compilation, and so is any step the build applies to a value that
    leaves the probes unchanged (`.lower()` on a lower-case probe). So a build takes every input as a named value
    and uses it as given. Model instances only (no values(), prefetch_related or distinct on unselected columns:
    those are not prepared and run through the ORM)."""

    def __init__(self, build: Callable[..., QuerySet], probes: Mapping[str, tuple[Any, Any]]) -> None:
        self._build = build
        self._probes = dict(probes)
        self._compiled: dict[str, tuple[SQLCompiler, str, tuple[Any, ...]] | None] = {}
        self._lock = threading.Lock()

    def all(self, using: str = "default", **values: Any) -> list[Model]:
        if values.keys() != self._probes.keys():
            raise TypeError(f"values for {sorted(self._probes)} expected, got {sorted(values)}")
        prepared = self._prepared(using)
        if prepared is None or any(type(value) is not type(self._probes[name][0]) or _naive(value)
                                   for name, value in values.items()):
            return list(self._build(**values).using(using))
        compiled, sql, slots = prepared
        params = tuple(values[slot[0]] if isinstance(slot, tuple) else slot for slot in slots)
        return _instances(compiled, sql, params)

    def first(self, using: str = "default", **values: Any) -> Model | None:
        rows = self.all(using, **values)
        return rows[0] if rows else None

    def _prepared(self, using: str) -> tuple[SQLCompiler, str, tuple[Any, ...]] | None:
        if using not in self._compiled:
            with self._lock:
                if using not in self._compiled:
                    try:
                        self._compiled[using] = self._compile(using)
                    except NotPreparable as exc:
                        # Still right (the ORM runs it), only slower: said once, where someone looks.
                        logger.warning("query %s is not prepared: %s", getattr(self._build, "__qualname__", "?"), exc)
                        self._compiled[using] = None
        return self._compiled[using]

    def _compile(self, using: str) -> tuple[SQLCompiler, str, tuple[Any, ...]]:
        if connections[using].vendor != "postgresql":
            raise NotPreparable(connections[using].vendor)
        if any(_naive(value) for pair in self._probes.values() for value in pair):
            raise NotPreparable("naive datetimes as probes")
        first = self._build(**{name: pair[0] for name, pair in self._probes.items()}).using(using)
        second = self._build(**{name: pair[1] for name, pair in self._probes.items()}).using(using)
        if (first._iterable_class is not ModelIterable or first._prefetch_related_lookups
                or first._known_related_objects):
            raise NotPreparable("only model instances, without prefetch_related, are prepared")
        compiler = first.query.get_compiler(using=using)
        try:
            sql, params = compiler.as_sql()
            sql2, params2 = second.query.get_compiler(using=using).as_sql()
        except EmptyResultSet as exc:
            raise NotPreparable("a query that is empty whatever the values") from exc
        if compiler.has_extra_select:
            raise NotPreparable("extra columns (distinct ordered by unselected columns)")
        if sql != sql2 or len(params) != len(params2):
            raise NotPreparable("the probes changed the query's shape")
        slots: list[Any] = []
        found: set[str] = set()
        for one, two in zip(params, params2, strict=True):
            if _same(one, two):
                slots.append(one)  # part of the shape
                continue
            names = [name for name, (a, b) in self._probes.items() if _same(one, a) and _same(two, b)]
            if len(names) != 1:
                raise NotPreparable(f"a parameter that is no named value: {one!r}")
            slots.append((names[0],))
            found.add(names[0])
        if found != self._probes.keys():
            raise NotPreparable(f"values not found as parameters: {sorted(self._probes.keys() - found)}")
        compiler.connection = None  # each call sets its own thread's: this one's must not be kept alive here
        return compiler, sql, tuple(slots)


def _naive(value: Any) -> bool:
    # Django makes a naive datetime aware before binding it: a step the prepared path would skip.
    return isinstance(value, datetime) and value.tzinfo is None


def _same(one: Any, two: Any) -> bool:
    return type(one) is type(two) and one == two


def _instances(compiled: SQLCompiler, sql: str, params: tuple[Any, ...]) -> list[Model]:
    """Run `sql` and build its rows as Django's ModelIterable does, from the compiler that compiled it (its select,
    klass_info and annotation columns)."""
    compiler = copy.copy(compiled)
    db = compiler.using
    compiler.connection = connections[db]  # this thread's: the one it was compiled on may be another thread's
    with compiler.connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    select, klass_info, annotation_col_map = compiler.select, compiler.klass_info, compiler.annotation_col_map
    model_cls = klass_info["model"]
    select_fields = klass_info["select_fields"]
    start, end = select_fields[0], select_fields[-1] + 1
    init_list = [f[0].target.attname for f in select[start:end]]
    populators = get_related_populators(klass_info, select, db)
    objects = []
    for row in compiler.results_iter([rows]):
        obj = model_cls.from_db(db, init_list, row[start:end])
        for populator in populators:
            populator.populate(row, obj)
        for attr_name, col_pos in (annotation_col_map or {}).items():
            setattr(obj, attr_name, row[col_pos])
        objects.append(obj)
    return objects
