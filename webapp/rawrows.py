"""Model instances from a hand-written query, for hot paths where compiling a queryset costs more than running it.

Django compiles a queryset to SQL on every evaluation. For a join of three
tables with a subquery that is about a millisecond of CPU, several times what
PostgreSQL takes to answer it. A query that every request runs can instead be
written once, with ``Columns`` selecting a model's fields under a table alias
and building the instance from its slice of the row, with the same field
conversions the ORM applies (a ``JSONField``'s text becomes Python values).
"""

from __future__ import annotations

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
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        quote = connection.ops.quote_name
        self.sql = ", ".join(f"{alias}.{quote(cast(str, f.column))}" for f in self.fields)
        self._converters: list[tuple[Any, list[Converter]]] = []
        for field in self.fields:
            column = field.get_col(alias)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            self._converters.append((column, found))

    def __len__(self) -> int:
        return len(self.fields)

    def build(self, values: Sequence[Any]) -> M:
        """The instance for this model's slice of a row (``len(self)`` values, in field order)."""
        converted = []
        for value, (column, converters) in zip(values, self._converters, strict=True):
            for convert in converters:
                value = convert(value, column, connection)
            converted.append(value)
        return self.model.from_db(connection.alias, self.attnames, converted)
