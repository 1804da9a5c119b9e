"""PostgreSQL's sessions: the LISTEN connection and NOTIFY wakeups, the settings of the
worker's own connections (bookkeeping, bounded silence), and the cursor that prepares the
worker's hot statements once per session."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg.pq import Format

from django_gator import conf
from django_gator.engines.base import Engine, Listener
from django_gator.engines.ends import ENDS_CHANNEL
from django_gator.engines.partition_moves import retrying_moves
from django_gator.models.workflows import WorkflowStep
from django_gator.states import StepState

if TYPE_CHECKING:
    from django_gator.worker.connections import NetworkBounds

#: The LISTEN/NOTIFY channel; the payload is the queue name.
CHANNEL = "django_gator"


class PostgresListener(Listener):
    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def wait(self, timeout: float) -> set[str]:
        queues = set()
        for notify in self.connection.notifies(timeout=timeout, stop_after=1):
            queues.add(notify.payload)
        # Drain whatever else arrived meanwhile without waiting.
        for notify in self.connection.notifies(timeout=0):
            queues.add(notify.payload)
        return queues


class PostgresSessions(Engine):
    """The session part of :class:`~django_gator.engines.postgresql.PostgresEngine`."""

    def wake(self, queues: Collection[str]) -> None:
        """A NOTIFY per queue, as dispatch sends: listening workers claim at once (delivered
        when the caller's transaction commits, if there is one). With ``GATOR_NOTIFY =
        False``, the wakeup datagrams instead (see Engine.wake)."""
        if not self.notifies:
            super().wake(queues)
            return
        with self.connection.cursor() as cursor:
            for queue in sorted(queues):
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])

    @contextmanager
    def listen(self) -> Iterator[Listener]:
        """A connection of its own (not Django's), in autocommit, listening on CHANNEL.
        Behind a transaction pooler, use the engine of a direct alias instead
        (``GATOR_LISTEN_DATABASE``; worker/pooling.py)."""
        django_connection = self.connection
        params = django_connection.get_connection_params()
        raw = django_connection.get_new_connection(params)
        try:
            raw.autocommit = True
            self._opened_own_connection(raw)  # a worker process bounds it as its others
            raw.execute(f"LISTEN {CHANNEL}")
            yield PostgresListener(raw)
        finally:
            raw.close()

    @contextmanager
    def listen_ends(self) -> Iterator[Listener]:
        """A connection of its own, in autocommit, listening on ENDS_CHANNEL: the
        payloads ``j<id>``/``r<id>`` of the flagged jobs and workflows that end
        (engines/ends.py)."""
        django_connection = self.connection
        raw = django_connection.get_new_connection(django_connection.get_connection_params())
        try:
            raw.autocommit = True
            raw.execute(f"LISTEN {ENDS_CHANNEL}")
            yield PostgresListener(raw)
        finally:
            raw.close()

    def flag_awaited(self, job_id: int) -> str | None:
        """Flag job ``job_id`` as awaited; its state (None: no such job). The UPDATE locks
        the row as the write of its end does, so either the end is returned here or that
        write sees the flag and NOTIFYs. On partitioned storage an end that moved the row
        to another partition while the flag waited makes PostgreSQL refuse the flag: it is
        run again, and finds the row ended."""

        def flag() -> Any:
            with self.connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {self.job_table} SET awaited = true WHERE id = %s RETURNING state",
                    [job_id],
                )
                return cursor.fetchone()

        row = retrying_moves(self, flag)
        return None if row is None else row[0]

    def flag_awaited_run(self, run_id: Any) -> None:
        """Flag the open steps of workflow ``run_id`` as awaited: each one's settling
        NOTIFYs (a step settled meanwhile is not matched, and the read after sees it)."""
        open_steps = (StepState.BLOCKED, StepState.RELEASED)
        steps = WorkflowStep.objects.using(self.alias).filter(workflow_id=run_id)
        steps.filter(state__in=open_steps).update(awaited=True)

    def prepare_bookkeeping(self) -> None:
        """The session of the fetcher's and heartbeat's connections (never the executors',
        which run user code), set once per connection:

        - ``synchronous_commit = off``: a claim or an outcome mark then costs no WAL
          flush. A PostgreSQL crash (not a clean restart) can undo the last moments of such
          writes; the affected jobs simply run again, and a dispatch, which commits in the
          caller's transaction, is never affected. GATOR_ASYNC_COMMIT = False leaves it on.
        - ``plan_cache_mode = force_generic_plan``: the claim and success-mark statements
          are prepared once per session (see prepared_cursor) and their plan does not
          depend on the values bound (the same index scans whatever the queue, the batch or
          the keyset position). Left to choose, PostgreSQL kept planning them anew at each
          run (a custom plan: its estimate for the generic one, with a LIMIT it cannot
          see, is higher), which took 0.35-0.7 ms of a claim whose execution takes 0.06-0.25
          ms. The statements this connection sends without parameters are not affected.
        - ``enable_seqscan = off``: that one plan is made at the session's first claim,
          with the table's size then (an empty table at a first start), when reading the
          whole table is the cheapest way to find a few rows; it stayed for the session's
          life, and the marks then read every page of the jobs table (on partitioned
          storage, of the active partition) to find their rows, dead tuples included: 1,170
          pages a mark under a long transaction, the CPU per job doubling in 80 s
          (docs/benchmarks.md). Off, the planner takes an index wherever one serves, as
          every statement of these connections means to (a table no index serves is still
          read whole).
        - ``idle_in_transaction_session_timeout`` = GATOR_HEARTBEAT_TIMEOUT: these
          threads' transactions last milliseconds, and one left open longer means the
          process stopped between two statements (frozen, or wedged by a job that holds
          the GIL in C code): the server then ends the session, and its transaction's
          locks go with it. Without it, a process wedged while its lifeline was inside a
          rescue's transaction held that row's lock for as long as it lived; another
          process's lifeline, rescuing the same row, waited on it inside its own round,
          so no heartbeat round of either ended, and the ``--processes`` supervisor, which
          takes a round that has not ended for a wait on the database unless another
          process's round has ended since, replaced neither (tests/worker/
          test_supervision.py, on a loaded machine). The executors' sessions, which run
          user code, keep no such limit.

        Behind a transaction pooler (``pooled``) a SET would stick to whichever server
        session ran it, so nothing is set there (docs/deployment.md: set
        synchronous_commit on the role), and nothing is prepared."""
        connection = self.connection
        connection.ensure_connection()
        raw = connection.connection
        if getattr(raw, "_gator_bookkeeping", False):
            return
        if self.pooled:
            raw.prepare_threshold = None  # see prepare_worker_session()
            raw._gator_bookkeeping = True
            return
        idle_ms = int(conf.heartbeat_timeout() * 1000)
        sql = (
            "SET plan_cache_mode TO force_generic_plan; SET enable_seqscan TO off;"
            f" SET idle_in_transaction_session_timeout TO {idle_ms}"
        )
        if conf.async_commit():
            sql += "; SET synchronous_commit TO off"
        with connection.cursor() as cursor:
            cursor.execute(sql, [])
        raw._gator_bookkeeping = True

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """Keepalive probes and TCP_USER_TIMEOUT on the server's socket, set for this
        session only: the backend of a worker gone silent ends, rolling back its
        transaction, after about ``bounds.seconds`` (the defaults are the OS's: a first
        probe after two hours, and unacknowledged data retransmitted for 15 minutes). And
        client_connection_check_interval, so that a statement still running when the
        worker went silent is cancelled too: otherwise PostgreSQL looks at the socket only
        between statements. No idle_in_transaction_session_timeout: it would also end a
        live worker's transaction left idle by a long job, which keepalives never do.

        Behind a transaction pooler (``pooled``) the server's session belongs to the pooler
        and is shared: nothing is set there (the client's socket, to the pooler, is still
        bounded), and psycopg never prepares a statement on the server (the next
        transaction may run on a session that does not have it)."""
        if self.pooled:
            raw.prepare_threshold = None
            return
        settings = {
            "tcp_keepalives_idle": bounds.keepalive_idle,
            "tcp_keepalives_interval": bounds.keepalive_interval,
            "tcp_keepalives_count": bounds.keepalive_count,
            "tcp_user_timeout": bounds.user_timeout_ms,
            "client_connection_check_interval": bounds.keepalive_interval * 1000,
        }
        sql = "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings))
        params = [item for name, value in settings.items() for item in (name, str(value))]
        with raw.cursor() as cursor:
            cursor.execute(sql, params)

    @contextmanager
    def _prepared_cursor(self, *, binary: bool = False) -> Iterator[Any]:
        """A cursor for the worker's hot statements (the claim, the batched success mark):
        it binds the parameters on the server and has the statement prepared on its first
        run, so PostgreSQL parses and plans each of them once per connection instead of on
        every claim (Django's cursors bind on the client and never prepare). Django's cursor
        wrapper goes around it, so execute wrappers and error translation apply as to any
        cursor. After five runs PostgreSQL may keep one generic plan for any parameters,
        when its estimated cost is no higher than that of the plans made for the values at
        hand (``plan_cache_mode = auto``); tests/test_plans.py checks those plans.

        The ordinary cursor instead: behind a transaction pooler (``pooled``: nothing may
        stay in a server session), and while queries are logged (DEBUG, or a test capturing
        them), as Django reads the text of a logged query from the client-side binding.

        ``binary``: the rows come back in PostgreSQL's binary format, read by psycopg's C
        loaders (a claim's rows: Django's loader of timestamps, which text needs, is
        Python; two timestamps a job). Values are then what those loaders give: aware
        timestamps in the session's time zone whatever ``USE_TZ`` says, JSON decoded;
        the ordinary cursor, when it is used instead, gives Django's text forms."""
        connection = self.connection
        if self.pooled or connection.queries_logged:
            with connection.cursor() as cursor:
                yield cursor
            return
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        with connection.wrap_database_errors:
            raw = _PreparedCursor(connection.connection)
        if binary:
            raw.format = Format.BINARY
        with connection.make_cursor(raw) as cursor:
            yield cursor

    def _prepared_row(self, sql: str, params: list[Any]) -> tuple[Any, ...]:
        """The one row ``sql`` returns, run as :meth:`_prepared_cursor` runs it (bound on
        the server, prepared on its first run; the ordinary cursor behind a transaction
        pooler or while queries are logged), on a cursor kept with the connection: a
        single dispatch's INSERT, the statement a web process sends most often. Making a
        cursor (psycopg's and Django's wrapper) and the context manager around it cost
        about as much as the rest of the client's work on that statement. Django's
        wrapper still goes around every execute: execute wrappers, error translation, the
        check that no broken transaction is open.

        The row comes back in binary, read by psycopg's C loaders (Django's text loader of
        timestamps is Python: about 5 microseconds more a dispatch). A timestamp is then
        given as Django's cursors give it (see _as_django)."""
        connection = self.connection
        if self.pooled or connection.queries_logged:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return tuple(cursor.fetchone())
        connection.close_if_health_check_failed()
        connection.ensure_connection()  # refuses an async context, as cursor() does
        connection.validate_thread_sharing()
        raw = connection.connection
        wrapper = getattr(raw, "_gator_row_cursor", None)
        if wrapper is None:
            with connection.wrap_database_errors:
                cursor = _PreparedCursor(raw)
            cursor.format = Format.BINARY
            wrapper = raw._gator_row_cursor = connection.make_cursor(cursor)
        wrapper.execute(sql, params)
        return tuple(
            [
                _as_django(connection, value) if isinstance(value, datetime) else value
                for value in wrapper.cursor.fetchone()
            ]
        )


def _as_django(connection: Any, value: datetime) -> datetime:
    """A timestamp psycopg's binary loader read (aware, in the session's time zone when
    its loader was made: it may have changed since) as Django's cursors give it on
    ``connection``: in the connection's time zone with ``USE_TZ``, else naive, in
    ``TIME_ZONE``."""
    zone = connection.timezone
    if zone is not None:
        return value.astimezone(zone)
    return value.astimezone(ZoneInfo(connection.timezone_name)).replace(tzinfo=None)


class _PreparedCursor(psycopg.Cursor[Any]):
    """psycopg's server-binding cursor, preparing every statement it runs (see
    PostgresEngine._prepared_cursor). Django opens its connections with psycopg's prepared
    statements off (``prepare_threshold`` None, which makes psycopg ignore even the
    statements it has prepared), so the threshold is lifted for this cursor's statements
    only: the connection's other cursors are left as configured."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
    ) -> _PreparedCursor:
        connection = self.connection
        threshold = connection.prepare_threshold
        if threshold is None:
            connection.prepare_threshold = 0
        try:
            super().execute(query, params, prepare=True if prepare is None else prepare, **kwargs)
        finally:
            if threshold is None:
                connection.prepare_threshold = None
        return self
