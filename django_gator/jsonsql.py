"""Appending to a JSON array column, in each database's SQL.

The engines write an attempt's error entry with it in their raw statements; the models'
domain verbs append to a job's audit trail with :class:`JsonAppend`, an ORM expression of the
same SQL. A leaf: Django's expressions only.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Func, JSONField, TextField, Value
from django.db.models.sql.compiler import SQLCompiler

#: ``{column}`` and ``{document}`` (a JSON text parameter) per database vendor.
_APPEND = {
    "postgresql": "COALESCE({column}, '[]'::jsonb) || jsonb_build_array({document}::jsonb)",
    "mysql": "JSON_ARRAY_APPEND(COALESCE({column}, '[]'), '$', JSON_EXTRACT({document}, '$'))",
    "sqlite": "json_insert(COALESCE({column}, '[]'), '$[#]', json({document}))",
}


def append_sql(vendor: str, column: str, document: str = "%s") -> str:
    """SQL whose value is the array in ``column`` with the JSON text ``document`` (by default
    the parameter ``%s``) appended; a NULL column counts as an empty array."""
    try:
        template = _APPEND[vendor]
    except KeyError:
        raise ValueError(f"no JSON append for the database vendor {vendor!r}") from None
    return template.format(column=column, document=document)


class JsonAppend(Func):
    """``UPDATE ... SET field = JsonAppend("field", '{"a": 1}')``: append one JSON document,
    given as its text, to the array in ``field``."""

    output_field = JSONField()

    def __init__(self, field_name: str, document: str) -> None:
        super().__init__(F(field_name), Value(document, output_field=TextField()))

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, tuple[Any, ...]]:
        column, document = self.get_source_expressions()
        column_sql, column_params = compiler.compile(column)
        document_sql, document_params = compiler.compile(document)
        sql = append_sql(connection.vendor, column_sql, document_sql)
        return sql, (*column_params, *document_params)
