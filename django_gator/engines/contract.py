"""The engine contract: every operation the package outside ``engines/`` asks of a database.

:func:`django_gator.engines.get_engine` returns a :class:`JobEngine`, so mypy refuses a call
from outside ``engines/`` to any name not listed here; what the engines share among
themselves (cursors, transactions, SQL fragments, the compare-and-set guard) stays behind
it. Each member's docstring says what it promises: the compare-and-set it makes (a *claim*
is ``id`` + ``attempts`` + ``reserved_by`` + ``state = 'running'``; a refusal is an answer,
never an exception: ``False``, or the id left out of the ids written), its round trips,
the index it relies on, and what it does inside the caller's transaction.

The conformance suite (``tests/engines/``) runs every promise against each real database;
``tests/engines/test_contract_members.py`` fails when a member here has no test there.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from django_gator.attempts import Claim, Failure, Mark
    from django_gator.engines.base import Engine
    from django_gator.engines.core import Listener, Position
    from django_gator.engines.gauges import QueueGauge
    from django_gator.models import Batch
    from django_gator.models.membership import Probe
    from django_gator.models.workflows import WorkflowRun, WorkflowStep
    from django_gator.rows import ClaimedJob, Inserted, InsertRow, JobRows, LostClaim
    from django_gator.windows import Window
    from django_gator.worker.connections import NetworkBounds

T = TypeVar("T")


class JobEngine(Protocol):
    """One database's statements for jobs, as the rest of the package may call them.

    An engine holds no connection: each call uses ``connections[alias]`` of the calling
    thread, so one engine serves every thread of a worker. Unless a member says otherwise,
    a call runs in the caller's transaction when one is open, and in autocommit (or a short
    transaction of its own) when none is."""

    # -- identity and capabilities -------------------------------------------------------
    @property
    def alias(self) -> str:
        """The Django database alias whose connection every call uses."""

    @property
    def vendor(self) -> str:
        """Django's vendor name of that database: ``postgresql``, ``mysql``, ``sqlite``."""

    @property
    def can_listen(self) -> bool:
        """Whether :meth:`listen` and :meth:`listen_ends` work (PostgreSQL's LISTEN)."""

    @property
    def notifies(self) -> bool:
        """Whether dispatch and :meth:`wake` NOTIFY listening workers (:attr:`can_listen`,
        unless ``GATOR_NOTIFY = False``); if not, :mod:`django_gator.wakeup`'s datagrams."""

    @property
    def supports_keyset(self) -> bool:
        """Whether :meth:`claim_and_mark` honours ``after`` and :meth:`ready_queues`
        ``known``; engines without it ignore both and read from the start of the index."""

    @property
    def workers_share_a_host(self) -> bool:
        """Every worker of the database runs on this host (SQLite's WAL is shared through
        memory): a rescuer may ask the OS whether a lapsed worker lives."""

    @property
    def pooled(self) -> bool:
        """The alias goes through a transaction pooler (``GATOR_POOLED_DATABASES``): the
        engine keeps nothing in a server session (no SET, LISTEN or prepared statement)."""

    # -- time and sessions -----------------------------------------------------------------
    def db_now(self) -> datetime:
        """The database's clock, aware (UTC). One statement."""

    def to_dt(self, value: Any) -> datetime:
        """A driver's timestamp as an aware datetime (naive values are UTC). No statement."""

    def atomic_job(self) -> AbstractContextManager[Any]:
        """The transaction an atomic job's ``handle()`` and success mark share. SQLite: atomic
        jobs take turns on the host, so other writers get the write lock between two of them."""

    def prepare_bookkeeping(self) -> None:
        """Tune this thread's connection for the worker's own writes (claims, marks,
        heartbeats). Cheap to call before every use: at most one statement per connection
        (PostgreSQL's SETs), none behind a pooler or on other databases."""

    def prepare_worker_session(self, raw: Any, bounds: NetworkBounds) -> None:
        """Have the server end this worker connection's session (rolling back its
        transaction, freeing its locks) after ``bounds`` of silence. ``raw`` is the
        driver's connection, just opened, in autocommit. At most one statement."""

    def listen(self) -> AbstractContextManager[Listener]:
        """A connection of its own, waiting for the wakeups that dispatch and :meth:`wake`
        send (engines with :attr:`can_listen`; the others raise NotImplementedError)."""

    def listen_ends(self) -> AbstractContextManager[Listener]:
        """A connection of its own, waiting for the ends of awaited jobs and workflows:
        payloads ``j<job id>`` and ``r<workflow id>`` (engines with :attr:`can_listen`;
        the others raise NotImplementedError)."""

    def flag_awaited(self, job_id: int) -> str | None:
        """Mark job ``job_id`` awaited, so its end NOTIFYs :meth:`listen_ends`; its state
        then (None: no such job). In autocommit only: the flag holds the row's lock until
        its transaction ends. Engines with :attr:`can_listen`."""

    def flag_awaited_run(self, run_id: Any) -> None:
        """Mark the open steps of workflow ``run_id`` awaited, so each one's settling
        NOTIFYs :meth:`listen_ends`. In autocommit only. Engines with :attr:`can_listen`."""

    def wake(self, queues: Collection[str]) -> None:
        """Tell idle workers that ``queues`` may have claimable jobs, at the caller's
        commit: a NOTIFY per queue where :attr:`notifies`, else wakeup datagrams."""

    # -- dispatch --------------------------------------------------------------------------
    def streams_rows(self, count: int) -> bool:
        """Whether :meth:`insert_rows` of ``count`` rows checks and encodes their arguments
        itself as it sends them (``JobRows.encode``). No statement."""

    def insert_rows(
        self,
        rows: JobRows,
        notify: set[str] | None = None,
        prepare: Callable[[int], None] | None = None,
        meanwhile: Callable[[Inserted], None] | None = None,
    ) -> Inserted:
        """Insert one dispatch call's ``waiting`` rows, in the caller's transaction; the
        answer (ids, created_at, next_execution_at) in the rows' order. One INSERT for any
        number of rows (a JSON document the database expands, split only past the
        engine's size limit, the parts in one transaction; PostgreSQL: ``unnest()``
        arrays, and from 1,000 rows COPY, its ids reserved in one statement before; MySQL
        8, which has no INSERT ... RETURNING: an INSERT and a read per row, in one
        transaction). ``notify``: queues whose idle workers wake when it commits
        (:meth:`wake`). ``prepare(n)`` builds the returned objects of the first ``n`` rows (those
        not built yet): it runs before ``meanwhile(answer)``, with every row at the latest
        (PostgreSQL's COPY: a chunk at a time, while the server reads the lines sent), and
        ``meanwhile`` once; an exception from either stores nothing."""

    def insert_unique(
        self, rows: Sequence[InsertRow], notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        """Insert rows with a ``unique_key``; where the key already has a waiting, failed or
        running job, that job's (id, created_at, next_execution_at) comes back with
        ``False`` instead of a new row. The database's unique index decides between two
        concurrent dispatches; each row is a savepoint, all in one transaction (the
        caller's if open). A deadlock is raised (the caller retries its own transaction)."""

    def insert_windowed(
        self, rows: Sequence[InsertRow], window: Window, notify: set[str] | None = None
    ) -> list[tuple[int, datetime, datetime, bool]]:
        """:meth:`insert_unique` for a class with ``unique_for``, ``debounce`` or
        ``throttle`` (``window``): the row's key is found taken by a job that finished within
        ``unique_for``; a debounced row replaces the arguments of the key's waiting job and
        moves its start to now + the window; a throttled one returns the waiting job, or
        starts no sooner than the key's last start + the window. The indexes of migration
        0023 decide between concurrent dispatches; a savepoint per try, all in one
        transaction (the caller's if open)."""

    def set_expiry(self, ids: Sequence[int], at: datetime | None, seconds: float | None) -> None:
        """Set ``expires_at`` on the jobs ``ids``: ``at``, or now + ``seconds`` by database
        time. One UPDATE per 1,000 ids, in the caller's transaction."""

    def expired_ids(self, limit: int) -> list[int]:
        """Up to ``limit`` ids of waiting or failed jobs whose ``expires_at`` has passed (by
        database time), soonest first, through the expiry index. No claim ever takes
        them (every claim statement checks the expiry); the expiry sweep settles them."""

    def insert_workflow(
        self,
        run: WorkflowRun,
        steps: Sequence[WorkflowStep],
        roots: Sequence[InsertRow],
        batches: Mapping[int, Batch] | None = None,
        members: Mapping[int, Sequence[InsertRow]] | None = None,
    ) -> list[tuple[int, datetime, datetime]]:
        """Insert a workflow run, its steps, the job rows of its first steps (``roots``) and
        the batches and members of its first batch steps, in one transaction (the
        caller's if open): all or nothing. Returns the roots' then the members' (id,
        created_at, next_execution_at)."""

    # -- claims ----------------------------------------------------------------------------
    def claim_and_mark(
        self,
        worker_id: str,
        queue: str,
        limit: int,
        succeeded: Sequence[Mark],
        after: Position | None = None,
    ) -> tuple[list[ClaimedJob], list[int]]:
        """Write the success marks ``succeeded`` (as :meth:`mark_succeeded`), then take up
        to ``limit`` due ``waiting``/``failed`` jobs of ``queue`` without a concurrency key
        for ``worker_id``: ``running``, ``attempts + 1``, ``reserved_by`` set. Returns the
        jobs (highest priority first, then by id) and the ids whose mark was written.

        A row another claim holds is never returned (``FOR UPDATE SKIP LOCKED``; SQLite's
        single writer), and a paused or limited queue yields nothing: one primary-key probe
        of its row in the queue table per statement. The jobs are read through the ready
        index (``gator_job_ready``; MariaDB ``gator_job_ready_my``) in its order, without a
        sort. Round trips, with marks and a limit: PostgreSQL one statement (when a mark
        is a batch member's, the marks and their batches' settling in one transaction,
        then the claim); SQLite and MariaDB one transaction. Without marks, the claim
        alone: one statement (MariaDB: SELECT ... FOR UPDATE SKIP LOCKED, then one UPDATE
        of what it picked, in one transaction)."""

    def ready_queues(self, known: Sequence[str] = ()) -> list[str]:
        """The queues holding waiting or failed jobs the ordinary claim takes, except
        paused ones, sorted: one statement, a skip scan (a descent per queue, whatever the
        number of rows) of the ready index on PostgreSQL and MariaDB (SQLite plans it on
        the (state, finished_at) index). ``known`` (:attr:`supports_keyset`): queues
        the caller claims from anyway, neither read nor returned."""

    def has_due_jobs(self, queues: Sequence[str] | None) -> bool:
        """Whether a due, unexpired job the ordinary claim takes waits in an unpaused queue
        of ``queues`` (None: any), row locks ignored (a burst worker then waits for it)."""

    def claim_by_id(self, worker_id: str, job_id: int) -> ClaimedJob | None:
        """Claim one ``waiting`` or ``failed`` job by primary key, due or not (run_jobs()
        and GATOR_IMMEDIATE choose the job themselves); None, writing nothing, if it is in
        any other state or gone. One transaction: the UPDATE, then a read of the row."""

    def running_claims(self, worker_id: str) -> list[Claim]:
        """The claims (id, attempts) of the jobs ``worker_id`` holds running. One statement."""

    def claim_state(self, job_id: int) -> tuple[str, int, str | None] | None:
        """(state, attempts, reserved_by) of a row, by primary key, to explain a
        compare-and-set that was refused; None if the row is gone. One statement."""

    def isolate(self, worker_id: str, job_id: int, attempts: int) -> bool:
        """Record that this attempt of a claimed job runs alone in its worker (a suspect's test
        run). A compare-and-set on the claim, by primary key: False, writing nothing, if the
        claim is no longer ``worker_id``'s at ``attempts``. One statement."""

    # -- outcomes (each a compare-and-set on its claim, found by primary key) --------------
    def mark_succeeded(self, worker_id: str, done: Sequence[Mark]) -> list[int]:
        """Write each mark's success (``succeeded``, ``finished_at``, its result) where the
        row is still ``running`` for ``worker_id`` at the mark's attempt; returns the ids
        written: a refused mark (re-claimed, rescued, cancelled, already written) is left
        out, and its row untouched. One UPDATE for all the marks, each row found by primary
        key, never through the running or (state, finished_at) index. A batch member's mark
        settles its batch in the same transaction. MariaDB has no UPDATE ... RETURNING: it
        answers every id or, when some were refused, none (the caller checks them)."""

    def mark_succeeded_and_insert(
        self,
        worker_id: str,
        done: Mark,
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """:meth:`mark_succeeded` of one claim and, only if it was written, insert ``rows``
        (a chain's next step) in the same transaction; False, inserting nothing, if the
        mark was refused. The new ids are added to ``inserted``."""

    def mark_failed_and_insert(
        self,
        worker_id: str,
        claim: Claim,
        failure: Failure,
        rows: Sequence[InsertRow],
        inserted: list[int] | None = None,
    ) -> bool:
        """Write ``failure`` on ``claim`` (``failed`` with its retry time, ``dead``, or
        ``cancelled`` if a cancellation was asked for; the error appended, the attempt
        given back if uncharged) and, only if written, insert ``rows`` (a chain's error
        handler) and settle a batch member's batch, in one transaction. False, writing
        nothing, if the claim was refused. The new ids are added to ``inserted``."""

    def mark_snoozed(self, worker_id: str, claim: Claim, seconds: float) -> bool:
        """The job raised Snooze: ``waiting`` again, due ``seconds`` from the database's
        now, its attempt given back, ``snoozes`` counted (``cancelled`` if asked for). A
        compare-and-set on ``claim``: False, writing nothing, if refused. One statement
        (with a batch member's settling, one transaction)."""

    def release(
        self, worker_id: str, claims: Sequence[Claim], *, handback: bool = False
    ) -> list[int]:
        """Give claims back to ``waiting`` without charging the attempt (``cancelled`` if
        asked for); ``handback`` counts it on the row. Returns the ids written; a refused
        claim is left out and untouched. One transaction, one UPDATE per claim, each by
        primary key; batch members' batches settled in it."""

    def with_steps(
        self, job_ids: Sequence[int], inserted: list[int] | None, write: Callable[[], T]
    ) -> T:
        """Run ``write`` (a write that may end some of ``job_ids``) and, if it wrote,
        release or cancel the workflow steps that follow them, in one transaction; a
        deadlock the database breaks runs it again from the start when the transaction is
        ours. No ids: just ``write()``, nothing more."""

    # -- long-running jobs (see django_gator.longjobs) ------------------------------------
    def save_progress(
        self,
        worker_id: str,
        claim: Claim,
        progress: str | None,
        checkpoint: str | None,
        logs: str | None = None,
    ) -> bool:
        """Write a running attempt's ``progress`` and/or ``checkpoint`` (JSON texts; None
        leaves that column as it is), and append ``logs`` (the attempt's captured-logs
        entry, a JSON object's text) to the job's ``logs`` array (NULL: empty), in the
        same statement: a compare-and-set on ``claim``, by primary key;
        False, writing nothing, if the claim is no longer ``worker_id``'s at that attempt.
        One UPDATE, in the caller's transaction when one is open (an atomic job's)."""

    def read_checkpoint(self, job_id: int) -> str | None:
        """The row's checkpoint as JSON text; None if it has none or is gone. One SELECT by
        primary key."""

    # -- workers, heartbeats and rescue ----------------------------------------------------
    def register_worker(
        self,
        worker_id: str,
        hostname: str,
        pid: int,
        queues: str,
        concurrency: int,
        *,
        supervisor: str = "",
        wakeup_address: str | None = None,
    ) -> None:
        """Insert the worker's row, its heartbeat now (database time). One statement."""

    def unregister_worker(self, worker_id: str) -> None:
        """Delete the worker's row. One statement."""

    def heartbeat(self, worker_id: str) -> bool:
        """Refresh the worker's heartbeat, by primary key; False if its row is gone (it was
        declared lost). One statement."""

    def wakeup_targets(self, cutoff: datetime) -> list[tuple[str, str, str]]:
        """(hostname, queues JSON, wakeup address) of the workers with a wakeup address and
        a heartbeat since ``cutoff``. One statement on the worker table."""

    def lapsed_workers(self, cutoff: datetime) -> list[tuple[str, str, int, datetime]]:
        """(id, hostname, pid, started_at) of the workers with no heartbeat since
        ``cutoff``. One statement on the worker table."""

    def lost_claims(self, cutoff: datetime, *, sweep: bool = False) -> list[LostClaim]:
        """Running jobs whose worker has no heartbeat since ``cutoff``. By default two
        statements: the lapsed workers, then (only if there are any) their jobs through the
        running index by owner, so no job is read while every worker is alive. ``sweep``:
        one statement over every running job, owners without a row included."""

    def rescue(
        self,
        lost: LostClaim,
        cutoff: datetime,
        *,
        dead: bool,
        error: str,
        last_error: str,
    ) -> bool:
        """Take a job back from a lost worker: ``waiting`` as a suspect, ``dead``, or
        ``cancelled`` if asked for, its batch settled. A compare-and-set on the lost claim,
        by primary key, that also checks ``isolated`` and, in the same statement, that the
        owner's heartbeat is still older than ``cutoff``: False, writing nothing, if the
        worker came back or the claim changed. One transaction."""

    def forget_workers(self, cutoff: datetime, only: Sequence[str] | None = None) -> int:
        """Delete the worker rows whose heartbeat lapsed before ``cutoff`` (of those, only
        ``only`` if given); returns how many. One statement."""

    def shared_memory_file(self) -> str | None:
        """A file every process using the database has mapped (SQLite's ``-shm``), if any.
        No statement."""

    # -- batches (called by the models' verbs, in the caller's transaction) ----------------
    def probe_batch(self, batch_id: int) -> Probe | None:
        """Lock the batch row (``FOR UPDATE``; SQLite: the write lock) and read whether a
        member is active, a dead one and a cancelled one, as of the newest commit; None if
        the row is gone. In the caller's transaction."""

    def reopen_batches(self, batch_ids: Collection[int]) -> None:
        """Lock ``batch_ids`` in id order and start a new generation of each completed one
        (dead members are about to run again). In the caller's transaction."""

    def settle_now(self, batch_ids: Collection[int]) -> list[int]:
        """Settle ``batch_ids`` in the caller's transaction: dispatch the callbacks now due,
        exactly once (the batch row's lock orders concurrent settlers); returns their ids."""

    # -- gauges ----------------------------------------------------------------------------
    def queue_gauges(self) -> tuple[datetime, list[QueueGauge]]:
        """The database's now and every queue's gauges (ready, scheduled, running, dead,
        oldest due and running times, paused), sorted by name. One statement, each part
        reading one index (the ready, running and dead ones; see engines/gauges.py, and
        tests/test_metrics.py for their plans), never the finished rows."""


def behind(engine: JobEngine) -> Engine:
    """The engine behind the contract, for the modules of ``engines/`` that are handed one
    from outside (:mod:`.reads`, the limited claim): every engine :func:`get_engine` makes
    is an :class:`~django_gator.engines.base.Engine`. Never called outside ``engines/``."""
    return cast("Engine", engine)
