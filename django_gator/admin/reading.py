"""Where the job admin's pages read (see :mod:`django_gator.replicas`).

With ``GATOR_READ_DATABASE``, a page that only reads (the job list and its counts and
filters, a job's page, the dashboard, the dead-job screen) reads the replica while it
answers and lags within ``GATOR_READ_DATABASE_MAX_LAG``; a POST (every action, the retry
button, the argument editor, pause and resume, limits, delete) reads and writes the
primary. After a POST, the session remembers where the primary's writes had reached, and
the next pages read the primary until the replica has replayed that far: the page after
an action shows what the action did, never the replica's older rows. Each page says where
it read, the replica's lag, or why it read the primary.

Without a replica, nothing here adds a statement or touches the session.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from django_gator import conf, replicas

#: The session key of the primary's position after this session's last write.
SESSION_KEY = "gator_written"
#: Methods of requests that only read.
READING = ("GET", "HEAD")


def source(request: HttpRequest) -> replicas.ReadSource:
    """Where this request reads; decided once per request."""
    chosen: replicas.ReadSource | None = getattr(request, "_gator_read_source", None)
    if chosen is not None:
        return chosen
    if replicas.read_database() is None:
        primary = conf.database()
        chosen = replicas.ReadSource(primary, primary)
    elif request.method not in READING:
        chosen = replicas.primary_source()
    else:
        session = getattr(request, "session", None)
        after = None if session is None else replicas.Written.from_dict(session.get(SESSION_KEY))
        chosen = replicas.read_source(after)
        if chosen.on_replica and after is not None and session is not None:
            del session[SESSION_KEY]  # the replica has it: no need to compare again
    request._gator_read_source = chosen  # type: ignore[attr-defined]
    return chosen


def alias(request: HttpRequest) -> str:
    """The alias this request reads (``GATOR_DATABASE`` without a replica)."""
    return source(request).alias


def using(request: HttpRequest, queryset: Any) -> Any:
    """``queryset`` on the alias this request reads (``GATOR_DATABASE`` without a
    replica, whatever the project's database routers say)."""
    return queryset.using(source(request).alias)


def context(request: HttpRequest) -> dict[str, Any]:
    """What the page shows about where it read (nothing without a replica)."""
    chosen = source(request)
    return {} if chosen.replica is None else {"gator_read_source": chosen}


def wrote(request: HttpRequest) -> None:
    """This request (a POST) may have written: until the replica has replayed the
    primary's writes so far, this session's pages read the primary."""
    if replicas.read_database() is None or request.method in READING:
        return
    session = getattr(request, "session", None)
    if session is None:
        return
    try:
        mark = replicas.written()
    except DatabaseError:  # the primary did not answer; the write failed as loudly
        mark = None
    if mark is not None:
        session[SESSION_KEY] = mark.as_dict()


class ReadingAdmin(admin.ModelAdmin):
    """The part of ``JobAdmin`` that reads its rows where :func:`source` says, shows where
    on its pages, and remembers its writes (the bulk actions and delete are POSTs to the
    job list and the delete page)."""

    def get_queryset(self, request: HttpRequest) -> Any:
        return using(request, super().get_queryset(request))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response = super().changelist_view(request, {**context(request), **(extra_context or {})})
        wrote(request)
        return response

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = {**context(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response = super().delete_view(request, object_id, extra_context)
        wrote(request)
        return response
