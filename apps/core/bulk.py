"""Many rows updated with their own values in one statement, without the ORM's per-value expressions.

`QuerySet.bulk_update` writes one statement too, but builds a `CASE WHEN pk = … THEN …` expression per row and
field and resolves each through the ORM: in bench-scale's sustained run, recording a rollout's three node
results and node rows that way was ~21% of a shard worker's CPU (py-spy --gil), more than the statements'
time in PostgreSQL. On PostgreSQL this sends `UPDATE … FROM (VALUES …)` with the values prepared by their
fields, as `save()` would; elsewhere (SQLite, the zero-setup default) it is `bulk_update`.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model


def bulk_set(model: type[Model], objs: Sequence[Model], fields: Sequence[str]) -> int:
    """Write `fields` of each object (by primary key) as bulk_update would; returns the rows updated."""
    if not objs:
        return 0
    if connection.vendor != "postgresql":
        return model.objects.bulk_update(objs, list(fields))
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    quote = connection.ops.quote_name
    # A VALUES column takes its type from its values: a column of NULLs or of plain strings is text, which
    # an inet, varchar or timestamp column does not take as it is, so each value is cast to its column's type.
    names = [f"c{i}" for i in range(len(columns))]
    assignments = ", ".join(f"{quote(field.column)} = v.{name}::{field.cast_db_type(connection)}"
                            for field, name in zip(columns[1:], names[1:], strict=True))
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    params: list[object] = []
    for obj in objs:
        params += [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in columns]
    sql = (f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "  # noqa: S608 (names from the model, values bound)
           f"FROM (VALUES {', '.join([row] * len(objs))}) AS v({', '.join(names)}) "
           f"WHERE t.{quote(meta.pk.column)} = v.c0::{meta.pk.cast_db_type(connection)}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
