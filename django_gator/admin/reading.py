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

With several job databases (``GATOR_QUEUE_DATABASES``), ``?database=ALIAS`` picks the one a
page reads and writes (the job list's "job database" filter, the selector at the top of
each page; a job's page keeps it from the list it came from); without it, GATOR_DATABASE.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, QueryDict

from django_gator import conf, replicas
from django_gator.databases import job_databases

#: The session key of the primary's position after this session's last write.
SESSION_KEY = "gator_written"
#: Methods of requests that only read.
READING = ("GET", "HEAD")
#: The query parameter that picks a job database other than GATOR_DATABASE.
DATABASE_PARAM = "database"


def picked_database(request: HttpRequest) -> str | None:
    """The job database other than GATOR_DATABASE this request asks for (``?database=``,
    or the job list's filters a job's page was opened from); None: GATOR_DATABASE. No
    statement, and nothing read from the request, without GATOR_QUEUE_DATABASES."""
    if not conf.get("GATOR_QUEUE_DATABASES"):
        return None
    value = request.GET.get(DATABASE_PARAM)
    if value is None:
        value = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_PARAM)
    if value and value != conf.database() and value in job_databases():
        return str(value)
    return None


def job_url(url: str, job: Any) -> str:
    """``url`` (of a page about ``job``) that reads the job's own database."""
    db = job._state.db
    if not conf.get("GATOR_QUEUE_DATABASES") or db in (None, conf.database()):
        return url
    return f"{url}?{urlencode({DATABASE_PARAM: db})}"


def source(request: HttpRequest) -> replicas.ReadSource:
    """Where this request reads; decided once per request."""
    chosen: replicas.ReadSource | None = getattr(request, "_gator_read_source", None)
    if chosen is not None:
        return chosen
    picked = picked_database(request)
    if picked is not None:
        chosen = replicas.ReadSource(picked, picked)  # no replica of its own
    elif replicas.read_database() is None:
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
    """What the page shows about where it read (nothing without a replica), and with
    several job databases a link to each (``gator_databases``: alias, url, selected)."""
    chosen = source(request)
    found: dict[str, Any] = {} if chosen.replica is None else {"gator_read_source": chosen}
    if conf.get("GATOR_QUEUE_DATABASES"):
        found["gator_database_picked"] = picked_database(request)  # kept by GET forms
        here = picked_database(request) or conf.database()
        found["gator_databases"] = [
            {
                "alias": alias,
                "url": request.path
                + ("" if alias == conf.database() else f"?{DATABASE_PARAM}={alias}"),
                "selected": alias == here,
            }
            for alias in job_databases()
        ]
    return found


def wrote(request: HttpRequest) -> None:
    """This request (a POST) may have written: until the replica has replayed the
    primary's writes so far, this session's pages read the primary."""
    if replicas.read_database() is None or request.method in READING:
        return
    if picked_database(request) is not None:
        return  # another job database than the replica's primary
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
