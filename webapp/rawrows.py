"""Model instances from a hand-written query, for the few reads every request makes.

Django compiles a queryset to SQL on every evaluation: for a join of three
tables with a subquery about a millisecond of CPU, several times what
PostgreSQL takes to answer it. The reads every request makes (the API key
with its tenant and plan, the job, a submit's voice, the tenant lock, the
ETA's aggregate) are written once instead, selecting a model's fields with
``columns(model, alias)`` and building the instance from its slice of the row
with the same field conversions the ORM applies (a ``JSONField``'s text
becomes Python values); everything else is the ORM's (docs/decisions.md).
Writes always go through the ORM (``save()``, ``update()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, Any], Any]


class Columns(Generic[M]):
    """Every concrete field of ``model``, selected from the table aliased ``alias``."""

    def __init__(self, model: type[M], alias: str) -> None:
        self.model = model
        self.table = f"{model._meta.db_table} {alias}"
        fields = list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in fields]
        quote = connection.ops.quote_name
        self.sql = ", ".join(f"{alias}.{quote(cast(str, f.column))}" for f in fields)
        self._converters: list[tuple[Any, list[Converter]]] = []
        for field in fields:
            column = field.get_col(alias)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            self._converters.append((column, found))

    def __len__(self) -> int:
        return len(self.attnames)

    def build(self, row: Sequence[Any], start: int = 0) -> M:
        """The instance for this model's slice of ``row``, which begins at ``start``."""
        values = []
        for value, (column, converters) in zip(row[start : start + len(self)], self._converters, strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            values.append(value)
        return self.model.from_db(connection.alias, self.attnames, values)


@functools.cache
def columns(model: type[Model], alias: str) -> Columns[Any]:
    """``Columns`` of ``model`` under ``alias``, made once per process, on first use (apps are loaded by then)."""
    return Columns(model, alias)


def fetch_one(sql: str, params: Sequence[Any] | dict[str, Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else tuple(row)
