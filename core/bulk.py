"""Writes of many rows at once, for the loops that record thousands of outcomes a pass."""

from collections import defaultdict
from typing import Any

from django.db import connections, models, router


def update_rows(model: type[models.Model], rows: list[tuple[Any, dict[str, Any]]]) -> None:
    """Set each row's own values: ``rows`` is (primary key, {field name: value}). Rows that set the same
    fields share one statement, sent for all of them at once (``executemany``): compiling an ORM update
    per row cost more than the database's work on it, and ``bulk_update``'s CASE per field and row grows
    with the batch."""
    connection = connections[router.db_for_write(model)]
    quote = connection.ops.quote_name
    groups: dict[tuple[str, ...], list[tuple[Any, dict[str, Any]]]] = defaultdict(list)
    for pk, values in rows:
        groups[tuple(sorted(values))].append((pk, values))
    for names, group in groups.items():
        fields = [_concrete(model, name) for name in names]
        assignments = ", ".join(f"{quote(str(field.column))} = %s" for field in fields)
        table, pk_column = quote(model._meta.db_table), quote(str(_concrete(model, "pk").column))
        sql = f"UPDATE {table} SET {assignments} WHERE {pk_column} = %s"
        params = [
            [field.get_db_prep_save(values[field.name], connection) for field in fields] + [pk]
            for pk, values in group
        ]
        with connection.cursor() as cursor:
            cursor.executemany(sql, params)


def _concrete(model: type[models.Model], name: str) -> models.Field:  # type: ignore[type-arg]
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field
