"""Several job databases: which database alias holds the jobs of a queue.

``GATOR_QUEUE_DATABASES = {"bulk": "jobs_bulk"}`` keeps the jobs of the queue ``bulk`` in
the database ``jobs_bulk``; every other queue stays on ``GATOR_DATABASE``. Each job database
is a whole django-gator database (migrated with ``manage.py migrate --database ALIAS``,
served by workers started with ``gator_worker --database ALIAS``): its jobs, and what only
makes sense among jobs that can see each other (a batch, a workflow or chain, the
schedules' runs, the flow limits' counts), live within it. A batch or workflow whose jobs'
queues are routed to different databases is refused at dispatch (:func:`one_database`).

With the setting unset (the default) every function here answers ``GATOR_DATABASE`` without
a statement, and dispatch takes the path it always took.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from django_gator import conf, schema
from django_gator.exceptions import CrossDatabase, SchemaMissing

_checked_lock = threading.Lock()
#: Routed aliases whose tables were found (each process looks once per alias).
_migrated: set[str] = set()


def routes() -> Mapping[str, str]:
    """``GATOR_QUEUE_DATABASES``: queue name -> database alias (empty when unset)."""
    value: Mapping[str, str] = conf.value("GATOR_QUEUE_DATABASES")
    return value


def for_queue(queue: str) -> str:
    """The alias of the database that holds the jobs of ``queue``."""
    routed = conf.get("GATOR_QUEUE_DATABASES")
    if not routed:  # unset: no validation, no lookup
        return conf.database()
    return routes().get(queue) or conf.database()


def job_databases() -> list[str]:
    """Every job database: ``GATOR_DATABASE`` first, then each routed alias once, in the
    order the setting names them."""
    aliases = [conf.database()]
    for alias in routes().values():
        if alias not in aliases:
            aliases.append(alias)
    return aliases


def one_database(what: str, queues: Iterable[str]) -> str:
    """The one database that holds the jobs of ``queues`` (a batch's, a workflow's);
    :class:`CrossDatabase`, naming the aliases and their queues, if they are routed to
    more than one."""
    by_alias: dict[str, list[str]] = {}
    for queue in queues:
        names = by_alias.setdefault(for_queue(queue), [])
        if queue not in names:
            names.append(queue)
    if len(by_alias) == 1:
        return next(iter(by_alias))
    if not by_alias:
        return conf.database()
    spread = "; ".join(
        f"{alias!r} holds queue{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"
        for alias, names in by_alias.items()
    )
    raise CrossDatabase(
        f"{what} spans several job databases ({spread}): a batch, a workflow or a chain "
        "lives within one database. Route its queues to the same alias in "
        "GATOR_QUEUE_DATABASES, or give its jobs queues that share one."
    )


def caller_transaction(alias: str) -> str | None:
    """The alias of a transaction the caller has open on another database than ``alias``
    (``default`` first, then the job databases), when none is open on ``alias``: a job
    routed to ``alias`` is inserted once that transaction commits, so a rollback there
    drops it. None when ``alias`` itself has one open (the insert joins it) or none is."""
    if connections[alias].in_atomic_block:
        return None
    for other in (DEFAULT_DB_ALIAS, *job_databases()):
        if other != alias and other in connections.settings and connections[other].in_atomic_block:
            return other
    return None


def check_migrated(alias: str) -> None:
    """:class:`SchemaMissing` (saying to run ``manage.py migrate --database ALIAS``) when
    the routed job database ``alias`` lacks django-gator's tables. Looked at once per
    process and alias; a database that does not answer is not judged (the insert then
    meets the outage as any other does)."""
    if alias in _migrated:
        return
    try:
        missing = schema.missing_tables(alias)
    except DatabaseError:
        return
    if missing:
        raise SchemaMissing(
            f"GATOR_QUEUE_DATABASES routes jobs to {alias!r}, but "
            + schema.missing_tables_message(alias, missing)
        )
    with _checked_lock:
        _migrated.add(alias)


def forget_checks() -> None:
    """Look again at every routed database's tables (tests; after a migrate)."""
    with _checked_lock:
        _migrated.clear()
