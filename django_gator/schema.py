"""Whether the django_gator tables exist: one helper for every place that must say so.

``gator_status``, the database system check (W003) and the worker ask
:func:`missing_tables` before they touch the tables, and print
:data:`MISSING_TABLES_MESSAGE` instead of a raw "no such table" / "relation does not exist".
"""

from __future__ import annotations

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections

#: What to tell the user when :func:`missing_tables` is not empty.
MISSING_TABLES_MESSAGE = "the django_gator tables do not exist: run `manage.py migrate`"


def tables() -> set[str]:
    """The tables of django_gator's models."""
    return {
        model._meta.db_table
        for model in apps.get_app_config("django_gator").get_models()
        if model._meta.managed and not model._meta.proxy
    }


def missing_tables(alias: str) -> list[str]:
    """The tables of django_gator's models that database ``alias`` does not have, sorted
    (empty when it is migrated). One introspection query; connects if needed, so a
    database that cannot be reached raises Django's ``OperationalError``."""
    wanted = tables()
    connection = connections[alias]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    # MySQL with lower_case_table_names, or tables created by hand in another case.
    present_lower = {name.lower() for name in present}
    return sorted(name for name in wanted if name.lower() not in present_lower)


def missing_tables_message(alias: str, missing: list[str]) -> str:
    """:data:`MISSING_TABLES_MESSAGE`, with the database and, when only some are missing,
    which ones."""
    message = f"{MISSING_TABLES_MESSAGE} (database {alias!r}"
    if alias != DEFAULT_DB_ALIAS:  # `migrate` alone migrates the default alias only
        message = message.replace("`manage.py migrate`", f"`manage.py migrate --database {alias}`")
    if 0 < len(missing) < len(tables()):
        message += f"; missing: {', '.join(missing)}"
    return message + ")"


def unapplied_migrations(alias: str) -> list[str]:
    """The names of django_gator's migrations not applied to database ``alias``, in the
    order ``migrate`` would apply them (empty when it is up to date)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    plan: list[tuple[str, str]] = []
    for leaf in loader.graph.leaf_nodes("django_gator"):
        plan += loader.graph.forwards_plan(leaf)
    return [
        name
        for app, name in dict.fromkeys(plan)
        if app == "django_gator" and (app, name) not in loader.applied_migrations
    ]
