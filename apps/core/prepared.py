"""Fixed-shape ORM queries and updates compiled once per database, then run with new values.

Django builds and compiles a queryset's SQL on every evaluation: for the API token lookup (select_related, an
annotation, an OR of expiry conditions) that is ~1.5 ms of CPU on every API call (tests/bench/bench_prepared.py),
several times the query's own round trip; a one-row `filter(...).update(...)` or `values_list(...)` costs ~0.5-0.7 ms
against ~0.15 ms for its SQL sent as it is (a route change's reconcile sends ~50 statements). A `PreparedQuery` is
written as an ordinary queryset, built from named values; it is compiled twice with two probe values per name, and
the parameters that differ are the named slots: every other parameter is part of the query's shape, whatever the
values. Each call then runs that SQL with the call's values and builds the model instances as Django's
ModelIterable does (select_related objects and annotations included), or the rows as values_list() gives them. A
`PreparedUpdate` is the same for a queryset's `update(**fields)`, and answers the row count.

Only where the compiled parameters are the values as given (PostgreSQL; SQLite adapts datetimes to text) and
only for values of the probes' types (None would change the SQL's shape: `IS NULL`): anything else runs the
queryset as Django would. A list of values is one named value where the query takes it as one array parameter:
`field__any=[...]` (AnyOf below), not `field__in`, whose SQL has a placeholder per item.
"""

from __future__ import annotations

import copy
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, transaction
from django.db.models import CharField, IntegerField, Model, QuerySet, sql
from django.db.models.fields.related import ForeignObject
from django.db.models.lookups import In
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable, get_related_populators
from django.db.models.sql.compiler import SQLCompiler
from psycopg.types.json import Json, Jsonb

logger = logging.getLogger(__name__)


# Two aware times to probe a named datetime with (any two distinct values do; a second datetime of the same query
# needs two others).
TIME_PROBES = (datetime(2001, 1, 1, tzinfo=UTC), datetime(2002, 2, 2, tzinfo=UTC))
# Two lists of ids to probe a `field__any=` value with.
ID_LIST_PROBES = ([1, 2], [3, 4])

# False: every prepared query and update runs through the ORM (tests/bench/bench_node_cost.py times a route change
# both ways in one run).
ENABLED = True

# Every prepared query and update made (they live at module level): a test runs a path and checks none it compiled
# fell back to the ORM.
ALL: weakref.WeakSet[_Prepared] = weakref.WeakSet()


class NotPreparable(Exception):
    """The query's values cannot be told apart from its shape in the compiled parameters."""


class _Prepared:
    """What a prepared query and a prepared update share: the probes, the compiled form per database, and telling
    the named values apart from the query's shape in the compiled parameters."""

    def __init__(self, build: Callable[..., Any], probes: Mapping[str, tuple[Any, Any]]) -> None:
        self._build = build
        self._probes = dict(probes)
        self._compiled: dict[str, Any] = {}
        self._lock = threading.Lock()
        ALL.add(self)

    def refused(self, using: str = "default") -> bool:
        """Compiled for `using` and found not preparable: its calls run through the ORM."""
        return using in self._compiled and self._compiled[using] is None

    def _usable(self, using: str, values: Mapping[str, Any]) -> Any:
        """The compiled form for these values, or None when they must run through the ORM."""
        if values.keys() != self._probes.keys():
            raise TypeError(f"values for {sorted(self._probes)} expected, got {sorted(values)}")
        if not ENABLED:
            return None
        prepared = self._prepared(using)
        if prepared is None or any(not _of_type(value, self._probes[name][0]) for name, value in values.items()):
            return None
        return prepared

    def _prepared(self, using: str) -> Any:
        if using not in self._compiled:
            with self._lock:
                if using not in self._compiled:
                    try:
                        if connections[using].vendor != "postgresql":
                            raise NotPreparable(connections[using].vendor)
                        if any(_naive(value) for pair in self._probes.values() for value in pair):
                            raise NotPreparable("naive datetimes as probes")
                        if any(value == [] for pair in self._probes.values() for value in pair):
                            raise NotPreparable("an empty list as a probe")
                        self._compiled[using] = self._compile(using)
                    except NotPreparable as exc:
                        # Still right (the ORM runs it), only slower: said once, where someone looks.
                        build = getattr(self._build, "func", self._build)  # a functools.partial's function
                        logger.warning("query %s is not prepared: %s", getattr(build, "__qualname__", "?"), exc)
                        self._compiled[using] = None
        return self._compiled[using]

    def _probed(self, index: int) -> dict[str, Any]:
        return {name: pair[index] for name, pair in self._probes.items()}

    def _compile(self, using: str) -> Any:
        raise NotImplementedError

    def _slots(self, compiled: tuple[str, tuple], other: tuple[str, tuple]) -> tuple[Any, ...]:
        """Each parameter of the first probes' SQL: a constant of the shape, or (name,) for a named value."""
        (sql1, params), (sql2, params2) = compiled, other
        if sql1 != sql2 or len(params) != len(params2):
            raise NotPreparable("the probes changed the query's shape")
        slots: list[Any] = []
        found: set[str] = set()
        for one, two in zip(params, params2, strict=True):
            if _same(one, two):
                slots.append(one)  # part of the shape
                continue
            names = [name for name, (a, b) in self._probes.items() if _as(one, a) and _as(two, b)]
            if len(names) != 1 or type(one) is not type(two):
                raise NotPreparable(f"a parameter that is no named value: {one!r}")
            # Django hands some values over wrapped (an integer compared with `<`: psycopg's Int8 of it; a JSON
            # value: psycopg's Jsonb, with the field's encoder), and so is each call's value then.
            slots.append((names[0],) if type(one) is type(self._probes[names[0]][0]) else (names[0], _wrapper(one)))
            found.add(names[0])
        if found != self._probes.keys():
            raise NotPreparable(f"values not found as parameters: {sorted(self._probes.keys() - found)}")
        return tuple(slots)


def _params(slots: tuple[Any, ...], values: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple((values[slot[0]] if len(slot) == 1 else slot[1](values[slot[0]])) if isinstance(slot, tuple)
                 else slot for slot in slots)


class PreparedQuery(_Prepared):
    """A queryset `build(**values)` of one shape whatever the values, compiled once per database.

    Only the named values change from call to call: anything else the build reads (the clock, a setting, a
    context variable) is frozen at the first compilation, and so is any step the build applies to a value that
    leaves the probes unchanged (`.lower()` on a lower-case probe). So a build takes every input as a named value
    and uses it as given. Model instances, or values_list() rows (flat or tuples, in the order of their fields):
    no values(), prefetch_related or distinct on unselected columns (those are not prepared and run through the
    ORM)."""

    def __init__(self, build: Callable[..., QuerySet], probes: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(build, probes)

    def all(self, using: str = "default", **values: Any) -> list[Any]:
        prepared = self._usable(using, values)
        if prepared is None:
            return list(self._build(**values).using(using))
        compiled, sql_text, slots, kind = prepared
        params = _params(slots, values)
        if kind is ModelIterable:
            return _instances(compiled, sql_text, params)
        rows = _rows(compiled, sql_text, params)
        return [row[0] for row in rows] if kind is FlatValuesListIterable else rows

    def first(self, using: str = "default", **values: Any) -> Any:
        rows = self.all(using, **values)
        return rows[0] if rows else None

    def _compile(self, using: str) -> tuple[SQLCompiler, str, tuple[Any, ...], type]:
        first = self._build(**self._probed(0)).using(using)
        second = self._build(**self._probed(1)).using(using)
        kind = first._iterable_class
        if kind not in (ModelIterable, ValuesListIterable, FlatValuesListIterable) or first._prefetch_related_lookups \
                or first._known_related_objects:
            raise NotPreparable("only model instances and values_list rows, without prefetch_related, are prepared")
        query = first.query
        if kind is not ModelIterable and list(first._fields) != [*query.extra_select, *query.values_select,
                                                                  *query.annotation_select]:
            raise NotPreparable("values_list fields in another order than their columns")
        compiler = query.get_compiler(using=using)
        try:
            compiled = compiler.as_sql()
            other = second.query.get_compiler(using=using).as_sql()
        except EmptyResultSet as exc:
            raise NotPreparable("a query that is empty whatever the values") from exc
        if compiler.has_extra_select:
            raise NotPreparable("extra columns (distinct ordered by unselected columns)")
        slots = self._slots(compiled, other)
        compiler.connection = None  # each call sets its own thread's: this one's must not be kept alive here
        return compiler, compiled[0], slots, kind


class PreparedUpdate(_Prepared):
    """`queryset.update(**fields)` where `build(**values)` gives (queryset, fields), of one shape whatever the values
    (the rules of PreparedQuery), compiled once per database; `run` answers the row count as update() does. An update
    of a parent model's fields too (multi-table inheritance) is not prepared."""

    def __init__(self, build: Callable[..., tuple[QuerySet, dict[str, Any]]],
                 probes: Mapping[str, tuple[Any, Any]]) -> None:
        super().__init__(build, probes)

    def run(self, using: str = "default", **values: Any) -> int:
        prepared = self._usable(using, values)
        if prepared is None:
            queryset, fields = self._build(**values)
            return queryset.using(using).update(**fields)
        sql_text, slots = prepared
        with transaction.mark_for_rollback_on_error(using=using), connections[using].cursor() as cursor:
            cursor.execute(sql_text, _params(slots, values))
            return cursor.rowcount

    def _compile(self, using: str) -> tuple[str, tuple[Any, ...]]:
        compiled = []
        for index in (0, 1):
            queryset, fields = self._build(**self._probed(index))
            if queryset.query.is_sliced or queryset.query.order_by:
                raise NotPreparable("a sliced or ordered update")
            query = queryset.query.chain(sql.UpdateQuery)
            query.add_update_values(fields)
            query.clear_select_clause()
            if query.related_updates:
                raise NotPreparable("an update of a parent model's fields")
            try:
                compiled.append(query.get_compiler(using).as_sql())
            except EmptyResultSet as exc:
                raise NotPreparable("an update that matches nothing whatever the values") from exc
        if not compiled[0][0]:
            raise NotPreparable("an update of no field")
        return compiled[0][0], self._slots(compiled[0], compiled[1])


def _of_type(value: Any, probe: Any) -> bool:
    """`value` may take the probe's place: of its type (a list: every item of the type of the probe's items)."""
    if type(value) is not type(probe) or _naive(value):
        return False
    return not isinstance(value, list) or all(type(item) is type(probe[0]) and not _naive(item) for item in value)


def _naive(value: Any) -> bool:
    # Django makes a naive datetime aware before binding it: a step the prepared path would skip.
    return isinstance(value, datetime) and value.tzinfo is None


def _same(one: Any, two: Any) -> bool:
    if type(one) is not type(two):
        return False
    if _is_json(one):  # no __eq__ of its own: the same wrapped value with the same encoder is the same parameter
        return _same(one.obj, two.obj) and one.dumps == two.dumps
    return one == two


def _as(param: Any, probe: Any) -> bool:
    """`param` is `probe` as given, or wrapped: in an int subclass (psycopg's Int4, Int8) or in psycopg's JSON
    wrapper, of the same value."""
    if type(param) is type(probe):
        return param == probe
    if _is_json(param):
        return type(param.obj) is type(probe) and param.obj == probe
    return type(probe) is int and isinstance(param, int) and not isinstance(param, bool) and param == probe


def _is_json(param: Any) -> bool:
    return isinstance(param, Json | Jsonb)


def _wrapper(param: Any) -> Callable[[Any], Any]:
    if _is_json(param):
        wrap, dumps = type(param), param.dumps
        return lambda value: wrap(value, dumps)
    return type(param)


class AnyOf(In):
    """`field__any=[values]`: the rows whose field is one of the values, as `field__in`, but on PostgreSQL sent as one
    array parameter (`= ANY(%s::bigint[])`) whatever the list's length, so that a prepared query can take a list of
    ids as one named value (an `__in` list compiles to another SQL text for each length). An empty list matches
    nothing. Elsewhere (SQLite: `make run`) it is `__in`. Registered on integer and text fields and relations
    (apps.core.apps), not on JSON fields."""

    lookup_name = "any"

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        if not self.rhs_is_direct_value():  # a subquery: as `__in` does it
            return super().as_sql(compiler, connection)
        lhs_sql, lhs_params = self.process_lhs(compiler, connection)
        field = self.lhs.output_field
        values = [field.get_db_prep_value(value, connection, prepared=True) for value in self.rhs if value is not None]
        return f"{lhs_sql} = ANY(%s::{field.cast_db_type(connection)}[])", (*lhs_params, values)


def register_lookups() -> None:
    # Not on every Field: on a JSON field `data__any` names the key "any", and would silently mean this instead.
    for field in (IntegerField, CharField, ForeignObject):  # a relation's lookups are its own, not Field's
        field.register_lookup(AnyOf)


def _rows(compiled: SQLCompiler, sql_text: str, params: tuple[Any, ...]) -> list[tuple]:
    """Run `sql_text` and convert its rows as ValuesListIterable does (the compiler's converters)."""
    compiler = copy.copy(compiled)
    compiler.connection = connections[compiler.using]
    with compiler.connection.cursor() as cursor:
        cursor.execute(sql_text, params)
        rows = cursor.fetchall()
    return list(compiler.results_iter([rows], tuple_expected=True))


def _instances(compiled: SQLCompiler, sql_text: str, params: tuple[Any, ...]) -> list[Model]:
    """Run `sql_text` and build its rows as Django's ModelIterable does, from the compiler that compiled it (its select,
    klass_info and annotation columns)."""
    compiler = copy.copy(compiled)
    db = compiler.using
    compiler.connection = connections[db]  # this thread's: the one it was compiled on may be another thread's
    with compiler.connection.cursor() as cursor:
        cursor.execute(sql_text, params)
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
