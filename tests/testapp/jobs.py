"""Jobs the test suite dispatches; worker subprocesses find them by autodiscovery."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from django_gator import JobCancelled, Queueable, Retry, Snooze, job, signals
from tests.testapp.models import Execution


class Noop(Queueable):
    def handle(self, *args: Any, **kwargs: Any) -> None:
        return None


class Record(Queueable):
    """Writes one ledger row per run; a second run of the same claim breaks the unique key."""

    def handle(self, label: str = "", sleep: float = 0.0) -> dict[str, Any]:
        if sleep:
            time.sleep(sleep)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        return {"label": label, "attempt": self.attempt}


class RecordOnce(Queueable):
    """Like Record, but a second run of the same job in any attempt fails."""

    def handle(self, label: str = "") -> None:
        Execution.objects.create(job_id=self.job_id, attempt=0, pid=os.getpid(), label=label)


class RecordFailsFirst(Queueable):
    """Writes its ledger row, then fails on its first attempt; retried at once."""

    retry = Retry(interval=0, max_retries=3)

    def handle(self, label: str = "") -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        if self.attempt == 1:
            raise RuntimeError(f"first attempt of {label} fails")


class Echo(Queueable):
    queue = "echo"
    priority = 5

    def handle(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs, "queue": self.queue}


class Boom(Queueable):
    def handle(self, message: str = "boom") -> None:
        raise RuntimeError(message)


class BoomWithRetry(Queueable):
    retry = Retry(interval=60, max_retries=2, queue="retries")

    def handle(self) -> None:
        raise ValueError(f"attempt {self.attempt} failed")


class ExitsProcess(Queueable):
    def handle(self) -> None:
        sys.exit(3)


class KillsWorker(Queueable):
    """A poison pill: SIGKILLs the worker process that runs it."""

    def handle(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Sleep(Queueable):
    """Sleeps, then writes its ledger row; touches ``started_file`` first, if given (a job
    seen ``running`` may be claimed but not started yet)."""

    def handle(self, seconds: float, label: str = "", started_file: str = "") -> None:
        if started_file:
            Path(started_file).touch()
        time.sleep(seconds)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


class HoldsTheGil(Queueable):
    """Wedges its worker process in C code that holds the GIL: a regular expression that
    backtracks for longer than any test (2**64 steps). No other thread of the process,
    its heartbeat's included, runs again."""

    def handle(self) -> None:
        re.match(r"(a+)+b", "a" * 64)


class ReturnsObject(Queueable):
    def handle(self) -> object:
        return object()


@job(queue="functions", priority=3)
def add(a: int, b: int) -> int:
    return a + b


@job
def record_kw(*, label: str) -> None:
    Execution.objects.create(job_id=0, attempt=0, pid=os.getpid(), label=label)


class TooSlow(Queueable):
    """Runs past its timeout in small steps (Python code, so the worker can interrupt it)."""

    timeout = 0.5

    def handle(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)
        Execution.objects.create(job_id=self.job_id, attempt=self.attempt, pid=os.getpid())


class TooSlowWithRetry(TooSlow):
    retry = Retry(interval=300, max_retries=1)


class ChainStep(Queueable):
    """Chain steps record '<Class>:<order>' in the ledger."""

    def handle(self, order: str) -> str:
        Execution.objects.create(
            job_id=self.job_id,
            attempt=self.attempt,
            pid=os.getpid(),
            label=f"{type(self).__name__}:{order}",
        )
        return type(self).__name__


class FetchData(ChainStep):
    queue = "chains"


class ProcessData(ChainStep):
    """Fails on its first two attempts, then succeeds."""

    queue = "chains"
    retry = Retry(interval=0, max_retries=3)

    def handle(self, order: str) -> str:
        if self.attempt < 3:
            raise ConnectionError(f"flaky attempt {self.attempt}")
        return super().handle(order)


class NotifyUser(ChainStep):
    queue = "chains"


class BrokenStep(ChainStep):
    queue = "chains"

    def handle(self, order: str) -> str:
        raise ValueError(f"cannot process {order}")


class ChainFailed(Queueable):
    queue = "chains"

    def handle(self, chain_id: str, job_id: int) -> None:
        Execution.objects.create(
            job_id=job_id, attempt=0, pid=os.getpid(), label=f"on_error:{chain_id}"
        )


class Spawner(Queueable):
    """Dispatches a job to another queue while it runs."""

    def handle(self, target: str) -> None:
        time.sleep(0.2)  # long enough for an idle fetcher to look for work meanwhile
        Echo.dispatch("spawned", queue=target)


class SlowProcessData(ProcessData):
    """ProcessData whose successful (third) attempt first sleeps: a window to SIGKILL its
    worker in the middle of a chain."""

    def handle(self, order: str) -> str:
        if self.attempt == 3:
            time.sleep(30)
        return super().handle(order)


# -- hooks, middleware, signals --------------------------------------------------------------

#: What middleware and hooks saw, in order (in-process workers only).
TRACE: list[Any] = []


def outer_middleware(job: Queueable, call_next: Any) -> Any:
    TRACE.append(("outer:before", job.job_id, job.attempt))
    try:
        return call_next()
    finally:
        TRACE.append(("outer:after", job.job_id))


class TenantMiddleware:
    """Class-based middleware: sets a context value around the job, from its kwargs."""

    current: str | None = None

    def __call__(self, job: Queueable, call_next: Any) -> Any:
        previous, TenantMiddleware.current = TenantMiddleware.current, job.kwargs.get("tenant")
        TRACE.append(("tenant:set", TenantMiddleware.current))
        try:
            return call_next()
        finally:
            TenantMiddleware.current = previous


def doubling_middleware(job: Queueable, call_next: Any) -> Any:
    return call_next() * 2


class Wrapped(Queueable):
    middleware = [TenantMiddleware(), doubling_middleware]

    def handle(self, value: int, tenant: str = "") -> int:
        TRACE.append(("handle", TenantMiddleware.current))
        return value


class SkippedByMiddleware(Queueable):
    """A middleware may decide not to run the job at all."""

    middleware = [lambda job, call_next: "skipped"]

    def handle(self) -> str:
        raise AssertionError("handle() must not run")


class FailsWithHook(Queueable):
    retry = Retry(interval=0, max_retries=1)

    def handle(self, label: str) -> None:
        raise KeyError(label)

    def on_error(self, exc: BaseException) -> None:
        TRACE.append(("on_error", self.job_id, self.attempt, type(exc).__name__))


class BrokenHook(Queueable):
    def handle(self) -> None:
        raise ValueError("job failed")

    def on_error(self, exc: BaseException) -> None:
        raise RuntimeError("the hook itself failed")


# -- unique jobs -----------------------------------------------------------------------------


class UniqueReport(Queueable):
    unique = True

    def handle(self, account_id: int, period: str = "month") -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=f"{account_id}"
        )


class SyncUser(Queueable):
    """Unique per user, whatever the other arguments."""

    def unique_key(self, user_id: int, reason: str = "") -> str:
        return f"user:{user_id}"

    def handle(self, user_id: int, reason: str = "") -> None:
        return None


@job(unique=True)
def refresh_feed(feed_id: int) -> None:
    return None


# -- cancellation ----------------------------------------------------------------------------


class Cancellable(Queueable):
    """Works in small steps and stops when asked to."""

    cancel_check_interval = 0.01

    def handle(self, seconds: float = 30) -> str:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label="started"
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.cancel_requested():
                raise JobCancelled(f"job {self.job_id} stopped on request")
            time.sleep(0.01)
        return "finished"


class FailsAfterCancel(Queueable):
    """Ignores the request, then fails: with a retry policy it would run again."""

    retry = Retry(interval=0, max_retries=5)

    def handle(self, flag_file: str) -> None:
        Path(flag_file).touch()
        deadline = time.monotonic() + 30
        while not self.cancel_requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("failed after the cancel request")


# -- atomic jobs -----------------------------------------------------------------------------


class AtomicRecord(Queueable):
    """Writes a ledger row inside its transaction; on its first attempt it can wait (touching
    ``flag_file`` once the row is written) so a test can SIGKILL the worker before the
    success mark."""

    atomic = True
    retry = Retry(interval=0, max_retries=3)

    def handle(self, label: str, flag_file: str = "", hold: float = 0) -> str:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        if flag_file and self.attempt == 1:
            Path(flag_file).touch()
            time.sleep(hold)
        return label


class UpdateAndHold(Queueable):
    """Stamps ledger row ``row_id`` with its attempt inside its transaction; on its first
    attempt it then sleeps ``hold`` seconds, the row still locked
    (tests/reliability/test_partitions.py)."""

    atomic = True

    def handle(self, row_id: int, hold: float = 0) -> str:
        Execution.objects.filter(pk=row_id).update(label=f"attempt {self.attempt}", pid=os.getpid())
        if self.attempt == 1:
            time.sleep(hold)
        return f"attempt {self.attempt}"


class KeepsDatabaseBusy(Queueable):
    """Writes its ledger row, then keeps the database busy for ``seconds``: with one long
    statement (``one_statement``) or a statement every 0.2 s. Atomic or not, by subclass."""

    def handle(self, label: str, seconds: float, one_statement: bool = False) -> str:
        from django.db import connection

        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        pg = connection.vendor == "postgresql"
        sleep_sql = "SELECT pg_sleep(%s)" if pg else "SELECT SLEEP(%s)"
        deadline = time.monotonic() + seconds
        with connection.cursor() as cursor:
            if one_statement:
                cursor.execute(sleep_sql, [seconds])
            while time.monotonic() < deadline:
                cursor.execute(sleep_sql, [min(0.2, max(deadline - time.monotonic(), 0))])
        return label


class KeepsDatabaseBusyAtomic(KeepsDatabaseBusy):
    atomic = True


class QueriesAfterPause(Queueable):
    """Not atomic: writes its ledger row, leaves its connection idle for ``seconds``, then
    writes to the row again on the same connection."""

    def handle(self, label: str, seconds: float) -> str:
        row = Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        time.sleep(seconds)
        Execution.objects.filter(pk=row.pk).update(label=f"{label} after the pause")
        return label


class ReportsConnection(Queueable):
    """Returns what bounds the silence of its database connection: the server's session
    settings and the client socket's options."""

    def handle(self) -> dict[str, Any]:
        from tests.partition import connection_bounds

        return connection_bounds()


class AtomicBoom(Queueable):
    """Writes a ledger row, then fails: the row must not survive."""

    atomic = True

    def handle(self, label: str) -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        raise RuntimeError("rolled back")


class NotAtomicBoom(Queueable):
    def handle(self, label: str) -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        raise RuntimeError("not rolled back")


class FailsFirstTime(Queueable):
    """No retry policy: dead after its first attempt; succeeds when an operator retries it."""

    redact = ["pin"]

    def handle(self, account: str, pin: str = "", password: str = "") -> str:
        if self.attempt == 1:
            raise PermissionError(f"login failed for {account} with password {password}")
        return f"ok on attempt {self.attempt}"


class RecordWithRetry(Record):
    """Record, retried at once when it fails (for instance when its connection is killed)."""

    retry = Retry(interval=0, max_retries=5)


class OutageTolerantRecord(Record):
    """Record, for the chaos harness: no retry policy. An attempt that a database outage
    cut short is run again with the same attempt number (it was given back), and its
    ledger row may have committed before the job saw the connection break (a server that
    stopped between the commit and its answer). That second run of the attempt marks the
    row ``+again`` instead of failing on the unique key, but only when the job's row
    counts an outage: any other second run of one claim still fails loudly."""

    def handle(self, label: str = "", sleep: float = 0.0) -> dict[str, Any]:
        from django.db import IntegrityError
        from django.db.models import F, Value
        from django.db.models.functions import Concat

        from django_gator.models import Job

        try:
            return super().handle(label, sleep)
        except IntegrityError:
            if not Job.objects.filter(pk=self.job_id, outages__gt=0).exists():
                raise
            Execution.objects.filter(job_id=self.job_id, attempt=self.attempt).update(
                label=Concat(F("label"), Value("+again"))
            )
            return {"label": label, "attempt": self.attempt}


class OutageTolerantRecordWithRetry(OutageTolerantRecord):
    retry = Retry(interval=0, max_retries=5)


# -- misbehaving jobs (tests/reliability/test_misbehaving.py) --------------------------------


class AsyncRecord(Queueable):
    """An ``async def`` handler that writes its ledger row with the async ORM."""

    async def handle(self, label: str = "", pause: float = 0.0) -> str:
        import asyncio

        if pause:
            await asyncio.sleep(pause)
        await Execution.objects.acreate(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        return f"async {label}"


@job
async def async_record(label: str) -> str:
    from asgiref.sync import sync_to_async

    await sync_to_async(Execution.objects.create)(job_id=0, attempt=0, pid=os.getpid(), label=label)
    return label


class AsyncBoom(Queueable):
    async def handle(self, message: str) -> None:
        raise ValueError(message)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception raises")


class BaseBoom(BaseException):
    """Not an Exception: what a job may raise through a library gone wrong."""


class RaisesOdd(Queueable):
    """Raises what a job may raise: a NUL byte, an unprintable exception, a lone
    surrogate, a 5 MB message, a BaseException subclass."""

    def handle(self, kind: str) -> None:
        if kind == "nul":
            raise ValueError("before\x00after")
        if kind == "unprintable":
            raise UnprintableError("the real message")
        if kind == "surrogate":
            raise ValueError("lone \udc80 surrogate")
        if kind == "huge":
            raise ValueError("x" * 5_000_000)
        if kind == "base":
            raise BaseBoom("not an Exception")
        raise AssertionError(kind)


class LeavesTransactionOpen(Queueable):
    """Opens a transaction with a raw BEGIN, writes a ledger row in it and returns."""

    def handle(self, label: str) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("START TRANSACTION" if connection.vendor == "mysql" else "BEGIN")
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


class LeavesAtomicOpen(Queueable):
    """Enters atomic() by hand and never leaves it."""

    def handle(self, label: str) -> None:
        from django.db import transaction

        transaction.atomic().__enter__()
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


class SetsReadOnlySession(Queueable):
    """Makes its session read-only: a later job on the same connection could not write."""

    def handle(self) -> None:
        from django.db import connection

        sql = {
            "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            "mysql": "SET SESSION TRANSACTION READ ONLY",
            "sqlite": "PRAGMA query_only = ON",
        }[connection.vendor]
        with connection.cursor() as cursor:
            cursor.execute(sql)


class StartsThread(Queueable):
    """Starts a non-daemon thread that outlives the job by far, then returns."""

    def handle(self, seconds: float = 600) -> None:
        import threading

        threading.Thread(target=time.sleep, args=(seconds,), name="job-stray", daemon=False).start()


class Misbehaves(Queueable):
    """Chaos harness: misbehaves on its first attempt as ``kind`` says, then, retried,
    writes its ledger row and succeeds (a stray thread's job succeeds at once)."""

    retry = Retry(interval=0, max_retries=5)
    #: The error each kind leaves in the history of its first attempt.
    ERRORS: ClassVar[dict[str, str]] = {
        "nul": "ValueError",
        "unprintable": "tests.testapp.jobs.UnprintableError",
        "surrogate": "ValueError",
        "base": "tests.testapp.jobs.BaseBoom",
        "transaction": "django_gator.exceptions.TransactionLeftOpen",
        "session": "RuntimeError",
    }
    KINDS = (*ERRORS, "thread")

    def handle(self, label: str, kind: str) -> None:
        from django.db import connection

        if self.attempt == 1:
            if kind == "nul":
                raise ValueError(f"{label} \x00 NUL")
            if kind == "unprintable":
                raise UnprintableError(label)
            if kind == "surrogate":
                raise ValueError(f"{label} \udc80 surrogate")
            if kind == "base":
                raise BaseBoom(label)
            if kind == "transaction":
                with connection.cursor() as cursor:
                    cursor.execute("START TRANSACTION" if connection.vendor == "mysql" else "BEGIN")
                Execution.objects.create(
                    job_id=self.job_id, attempt=0, pid=os.getpid(), label=label
                )
                return  # the stray transaction, and this row with it, is rolled back
            if kind == "session":
                SetsReadOnlySession().handle()
                raise RuntimeError(f"{label}: left its session read-only")
            if kind == "thread":
                import threading

                threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


class AtomicHold(Queueable):
    """An atomic job that writes its ledger row, then keeps its transaction open for
    ``hold`` seconds (on SQLite: the database's write lock, for that long). No retry
    policy: a failed attempt ends the job ``dead``."""

    atomic = True

    def handle(self, hold: float, label: str = "") -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        time.sleep(hold)


def _wait_for_file(path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


class AtomicAfterFlag(Queueable):
    """An atomic job whose transaction opens once ``flag_file`` exists (a job_started
    receiver, which runs before it, waits for the file); then it writes its ledger row.
    No retry policy."""

    atomic = True

    def handle(self, flag_file: str, label: str = "") -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


def _wait_for_flag(sender: type[Queueable], job: Queueable, **kwargs: Any) -> None:
    _wait_for_file(job.kwargs["flag_file"])


signals.job_started.connect(_wait_for_flag, sender=AtomicAfterFlag)


class RecordAfterFlag(Queueable):
    """Waits for ``flag_file``, then writes its ledger row outside any transaction of its
    own. No retry policy."""

    def handle(self, flag_file: str, label: str = "") -> None:
        _wait_for_file(flag_file)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )


# -- snooze (tests/worker/test_snooze.py) ---------------------------------------------------------


def _runs_so_far(job_id: int | None) -> int:
    """Ledger rows of this job: how many times its handle() ran before (snoozes included;
    the attempt number does not move when a job snoozes)."""
    return Execution.objects.filter(job_id=job_id).count()


class SnoozesThenSucceeds(Queueable):
    """Snoozes ``times`` times (``seconds``, or ``minutes`` as a timedelta), then succeeds.
    Its retry policy must stay untouched by the snoozes; ``on_error`` must not be called."""

    queue = "snooze"
    retry = Retry(interval=0, max_retries=1)

    def handle(self, times: int = 1, seconds: float = 30, minutes: float = 0) -> dict[str, Any]:
        runs = _runs_so_far(self.job_id)
        Execution.objects.create(
            job_id=self.job_id, attempt=runs, pid=os.getpid(), label=f"attempt {self.attempt}"
        )
        if runs < times:
            raise Snooze(timedelta(minutes=minutes) if minutes else seconds)
        return {"attempt": self.attempt, "runs": runs + 1}

    def on_error(self, exc: BaseException) -> None:
        TRACE.append(("on_error", type(exc).__name__))


class SnoozesOnceUnique(SnoozesThenSucceeds):
    unique = True


class AtomicSnooze(Queueable):
    """An atomic job that writes a ledger row in its transaction, then snoozes on its first
    run (``flag_file`` marks that run, outside the transaction): the row must roll back."""

    queue = "snooze"
    atomic = True

    def handle(self, label: str, flag_file: str) -> str:
        first = not Path(flag_file).exists()
        Path(flag_file).touch()
        Execution.objects.create(
            job_id=self.job_id,
            attempt=0 if first else 1,
            pid=os.getpid(),
            label=label if first else f"{label} done",
        )
        if first:
            raise Snooze(30)
        return label


class AsyncSnooze(Queueable):
    """An ``async def`` handler that snoozes on its first run."""

    queue = "snooze"

    async def handle(self, seconds: float = 30) -> str:
        runs = await Execution.objects.filter(job_id=self.job_id).acount()
        await Execution.objects.acreate(
            job_id=self.job_id, attempt=runs, pid=os.getpid(), label="async"
        )
        if runs == 0:
            raise Snooze(seconds)
        return "async done"


@job(queue="snooze")
def snooze_until_file(flag_file: str, seconds: float = 30) -> str:
    """A ``@job`` function: snoozes until ``flag_file`` exists (and creates it)."""
    path = Path(flag_file)
    if not path.exists():
        path.touch()
        raise Snooze(seconds)
    return "ran after the snooze"


#: Snooze delays that must be refused, by name (JSON cannot carry NaN or infinities).
BAD_SNOOZES: dict[str, Any] = {
    "negative": -1,
    "nan": float("nan"),
    "infinite": float("inf"),
    "text": "30",
    "bool": True,
    "none": None,
    "too long": timedelta(days=400),
}


class SnoozesBadly(Queueable):
    queue = "snooze"

    def handle(self, kind: str) -> None:
        raise Snooze(BAD_SNOOZES[kind])


class SnoozeWithBadSeconds(Snooze):
    """A subclass that sets its own delay after the check: caught when the outcome is
    decided."""

    def __init__(self) -> None:
        super().__init__(1)
        self.seconds = -5


class SnoozesThroughSubclass(Queueable):
    queue = "snooze"

    def handle(self) -> None:
        raise SnoozeWithBadSeconds()


class SnoozesWhenCancelled(Queueable):
    """Touches ``flag_file``, waits for a cancel request, then snoozes: cancel wins."""

    queue = "snooze"
    cancel_check_interval = 0.01

    def handle(self, flag_file: str) -> None:
        Path(flag_file).touch()
        deadline = time.monotonic() + 30
        while not self.cancel_requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise Snooze(30)


class SnoozeStep(Queueable):
    """A chain step that snoozes on its first run, then records itself."""

    queue = "chains"

    def handle(self, order: str) -> str:
        runs = _runs_so_far(self.job_id)
        Execution.objects.create(
            job_id=self.job_id, attempt=runs, pid=os.getpid(), label=f"SnoozeStep:{order}"
        )
        if runs == 0:
            raise Snooze(30)
        return "SnoozeStep"


class DagStep(Queueable):
    """A workflow step for the DAG tests: ledger rows at its start (every attempt) and at
    its end (the successful one: job id negated), labelled ``start:<node>`` (a member of a
    batch step: ``start:<node>.<member>``). Attempts up to ``fail_until`` fail (each
    retried at once; the third failure is dead)."""

    retry = Retry(interval=0, max_retries=2)

    def handle(self, node: int, fail_until: int = 0, member: int | None = None) -> None:
        name = f"{node}" if member is None else f"{node}.{member}"
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=f"start:{name}"
        )
        time.sleep(0.002 * (node % 5))
        if self.attempt <= fail_until:
            raise RuntimeError(f"node {name} fails on attempt {self.attempt}")
        Execution.objects.create(
            job_id=-self.job_id, attempt=self.attempt, pid=os.getpid(), label=f"end:{name}"
        )


class FanOut(Queueable):
    """The first member of a workflow's batch step that adds the others while it runs
    (members known only at run time): ``count`` DagStep members ``<node>.1`` .. ``<node>.N``,
    the member ``fail_member`` failing until its attempt ``fail_until``. Atomic: its
    members commit with its success, so a failed attempt adds none."""

    atomic = True
    retry = Retry(interval=0, max_retries=2)

    def handle(self, node: int, count: int, fail_member: int = 0, fail_until: int = 0) -> None:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=f"start:{node}.0"
        )
        batch = self.batch()
        assert batch is not None, "a FanOut runs as a member of a batch"
        batch.add_many(
            DagStep,
            [
                {"node": node, "member": m, "fail_until": fail_until if m == fail_member else 0}
                for m in range(1, count + 1)
            ],
        )
        Execution.objects.create(
            job_id=-self.job_id, attempt=self.attempt, pid=os.getpid(), label=f"end:{node}.0"
        )


class WorkflowFailed(Queueable):
    """A workflow's on_error job: records which workflow and job."""

    def handle(self, workflow_id: str, job_id: int) -> None:
        Execution.objects.create(
            job_id=0, attempt=job_id, pid=os.getpid(), label=f"on_error:{workflow_id}"
        )


# -- async jobs on the worker's event loop (tests/test_async_jobs.py) ------------------------


class AsyncSleep(Queueable):
    """Waits without holding a thread; returns the name of the thread it ran on."""

    queue = "aio"

    async def handle(self, seconds: float = 0.2) -> str:
        import asyncio
        import threading

        await asyncio.sleep(seconds)
        return threading.current_thread().name


class AsyncSlowpoke(Queueable):
    """Sleeps past its timeout; records that its coroutine saw the cancellation."""

    queue = "aio"
    timeout = 0.3
    retry = Retry(interval=0, max_retries=1)

    async def handle(self) -> None:
        import asyncio

        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await Execution.objects.acreate(
                job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label="cancelled"
            )
            raise


class AsyncUntilCancelled(Queueable):
    """Polls acancel_requested() until an operator cancels it."""

    queue = "aio"
    cancel_check_interval = 0.05

    async def handle(self) -> str:
        import asyncio

        await Execution.objects.acreate(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label="started"
        )
        for _ in range(600):
            if await self.acancel_requested():
                raise JobCancelled("asked to stop")
            await asyncio.sleep(0.05)
        return "never cancelled"


class AsyncLeavesTransaction(Queueable):
    """Opens a transaction on the ORM thread's connection and never ends it."""

    queue = "aio"

    async def handle(self) -> None:
        from asgiref.sync import sync_to_async
        from django.db import transaction

        def begin() -> None:
            transaction.set_autocommit(False)
            Execution.objects.create(job_id=self.job_id, attempt=self.attempt, pid=0, label="lost")

        await sync_to_async(begin)()


async def async_layer(job: Any, call_next: Any) -> Any:
    await Execution.objects.acreate(job_id=job.job_id, attempt=10, pid=0, label="async-before")
    result = await call_next()
    await Execution.objects.acreate(job_id=job.job_id, attempt=14, pid=0, label="async-after")
    return result


def sync_layer(job: Any, call_next: Any) -> Any:
    Execution.objects.create(job_id=job.job_id, attempt=11, pid=0, label="sync-before")
    result = call_next()
    Execution.objects.create(job_id=job.job_id, attempt=13, pid=0, label=f"sync-after:{result}")
    return result


class AsyncLayered(Queueable):
    queue = "aio"
    middleware = (async_layer, sync_layer)

    async def handle(self) -> str:
        await Execution.objects.acreate(job_id=self.job_id, attempt=12, pid=0, label="handle")
        return "layered"


class SyncLayered(Queueable):
    """A sync job under the same middleware: an async one wraps it too."""

    queue = "aio"
    middleware = (async_layer, sync_layer)

    def handle(self) -> str:
        Execution.objects.create(job_id=self.job_id, attempt=12, pid=0, label="handle")
        return "sync layered"


@job(queue="aio")
async def async_add(a: int, b: int) -> int:
    return a + b


class ThreadSleep(Queueable):
    """The sync twin of AsyncSleep (benchmarks/io_bound.py): waits, holding its thread."""

    queue = "aio"

    def handle(self, seconds: float = 0.2) -> str:
        import threading

        time.sleep(seconds)
        return threading.current_thread().name


class BatchCallback(Queueable):
    """A batch callback: a ledger row labelled ``<kind>:<batch id>`` per run."""

    kind = "callback"

    def handle(self, batch_id: int) -> None:
        Execution.objects.create(
            job_id=self.job_id,
            attempt=self.attempt,
            pid=os.getpid(),
            label=f"{self.kind}:{batch_id}",
        )


class BatchCompleted(BatchCallback):
    kind = "complete"


class BatchSucceeded(BatchCallback):
    kind = "success"


class BatchMemberDead(BatchCallback):
    kind = "dead"


class AtomicBatchCompleted(BatchCompleted):
    """on_complete whose ledger row commits with its success mark: counted exactly once."""

    atomic = True


class AtomicBatchSucceeded(BatchSucceeded):
    atomic = True


# -- flow control (tests/test_flow_control.py) ------------------------------------------------
def _span(path: str, key: str, seconds: float, job_id: int) -> None:
    """Append "job_id key start end pid" to ``path`` (one write: lines never interleave)."""
    start = time.time()
    time.sleep(seconds)
    line = f"{job_id} {key} {start:.6f} {time.time():.6f} {os.getpid()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Span(Queueable):
    """No limits of its own: held by its queue's limits, if any."""

    queue = "spans"

    def handle(self, path: str, key: str, seconds: float) -> None:
        _span(path, key, seconds, self.job_id)


class KeyedSpan(Queueable):
    """At most two running per key."""

    queue = "keyed"
    concurrency_limit = 2

    def concurrency_key(self, path: str, key: str, seconds: float) -> str:
        return f"account:{key}"

    def handle(self, path: str, key: str, seconds: float) -> None:
        _span(path, key, seconds, self.job_id)


class RatedSpan(Queueable):
    """At most five starts a second per key."""

    queue = "rated"
    rate_limit = "5/s"

    def concurrency_key(self, path: str, key: str, seconds: float) -> str:
        return key

    def handle(self, path: str, key: str, seconds: float) -> None:
        _span(path, key, seconds, self.job_id)


class OneAtATime(Queueable):
    """One running for the whole class (no concurrency_key)."""

    queue = "keyed"
    concurrency_limit = 1

    def handle(self, path: str, key: str, seconds: float) -> None:
        _span(path, key, seconds, self.job_id)


@job(queue="keyed", concurrency_limit=1, concurrency_key=lambda user: f"user:{user}")
def sync_user(user: int) -> int:
    return user


class LosesItsConnection(Queueable):
    """No retry policy. Until ``go_file`` exists: writes the server's id of its connection
    to ``backend_file``, waits for ``go_file`` (the test kills that connection meanwhile),
    then queries on it. Once ``go_file`` exists it just writes its ledger row."""

    def handle(self, backend_file: str, go_file: str) -> str:
        from django.db import connection

        if not Path(go_file).exists():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_backend_pid()"
                    if connection.vendor == "postgresql"
                    else "SELECT CONNECTION_ID()"
                )
                # Written whole, then renamed: the test polls for the file and reads it
                # at once, and must never see it created but still empty.
                partial = Path(f"{backend_file}.partial")
                partial.write_text(str(cursor.fetchone()[0]))
                partial.rename(backend_file)
            deadline = time.monotonic() + 30
            while not Path(go_file).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label="after"
        )
        return "ok"


class BlocksForever(Queueable):
    """Sets no timeout and blocks on an event nobody sets (a C-level wait, which no
    JobTimeout raised into its thread interrupts); appends a line to ``started_file`` first,
    so a test knows each run has begun (a job seen ``running`` may not have started)."""

    def handle(self, started_file: str) -> None:
        import threading

        with open(started_file, "a") as started:
            started.write(f"{os.getpid()} {self.attempt}\n")
        threading.Event().wait()


class BlocksForeverWithRetry(BlocksForever):
    retry = Retry(interval=300, max_retries=3)


class LoopsForever(Queueable):
    """Sets no timeout and runs Python code for ``seconds`` (so a timeout interrupts it)."""

    def handle(self, seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)
        return "finished"


class LoopsWithOwnTimeout(LoopsForever):
    timeout = 10.0


#: One entry per run of NotesItsConnection in this process: (thread name, whether its
#: ``default`` connection was open when handle() began, time.monotonic() at its start and
#: at its end).
CONNECTION_NOTES: list[tuple[str, bool, float, float]] = []


class NotesItsConnection(Queueable):
    """Notes whether its thread's connection was open when it began, then writes its ledger
    row (a query, as a user's job makes) and holds its thread ``seconds``."""

    queue = "warm"

    def handle(self, seconds: float = 0.0) -> None:
        import threading

        from django.db import connection

        started = time.monotonic()
        was_open = connection.connection is not None
        Execution.objects.create(
            job_id=self.job_id,
            attempt=self.attempt,
            pid=os.getpid(),
            label="open" if was_open else "closed",
        )
        if seconds:
            threading.Event().wait(seconds)
        CONNECTION_NOTES.append(
            (threading.current_thread().name, was_open, started, time.monotonic())
        )


# -- results between steps (tests/test_workflow_results.py) ---------------------------------


class Produces(Queueable):
    """Returns ``value`` (a workflow step whose result its dependents read)."""

    queue = "results"

    def handle(self, value: Any) -> Any:
        return value


class Gathers(Queueable):
    """Returns what ``self.results()`` gave it, and ``extra``."""

    queue = "results"

    def handle(self, extra: Any = None) -> dict[str, Any]:
        return {"results": self.results(), "extra": extra}


class ReturnsTooMuch(Queueable):
    """Returns a string of ``size`` characters."""

    queue = "results"

    def handle(self, size: int) -> str:
        return "x" * size


class Escalates(Queueable):
    """A wait's on_timeout: returns what it was called with."""

    queue = "results"

    def handle(self, workflow_id: str, signal: str) -> dict[str, str]:
        return {"escalated": signal, "workflow": workflow_id}


class LedgerStep(Queueable):
    """A workflow step for the chaos test (tests/reliability/test_workflow_chaos.py):
    sleeps ``sleep`` seconds (a SIGKILL may land meanwhile), then writes its ledger row in
    its transaction, which commits with its success mark; returns its label and the
    results it was given."""

    atomic = True
    queue = "results"
    retry = Retry(interval=0, max_retries=3)

    def handle(self, label: str, sleep: float = 0.0) -> dict[str, Any]:
        inputs = self.results()
        time.sleep(sleep)
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=label
        )
        return {"label": label, "inputs": inputs}


# Registered with the others, for worker subprocesses (autodiscovery imports this module).
from tests.testapp import isolated_jobs, log_jobs, long_jobs  # noqa: E402, F401


class SecretRecord(Queueable):
    """An encrypted job: writes the card it was given to the ledger (what the handler saw),
    checkpoints and returns it, and with ``fail`` raises an error that quotes it."""

    encrypted = True
    queue = "secrets"
    retry = Retry(interval=0, max_retries=1)

    def handle(self, card: str, *, fail: bool = False, sleep: float = 0.0) -> dict[str, Any]:
        if sleep:
            time.sleep(sleep)
        self.checkpoint({"card": card, "seen": self.checkpoint_data})
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=card
        )
        if fail:
            raise ValueError(f"card {card} was declined")
        return {"card": card}


class SecretIsolated(SecretRecord):
    """SecretRecord run in a child process: the child opens its data, the worker seals
    what crosses back (checkpoint, result)."""

    isolation = "process"
    queue = "secrets-isolated"


class SecretUnique(Queueable):
    """An encrypted unique job: its unique key is stored as a keyed digest."""

    encrypted = True
    unique = True

    def handle(self, email: str) -> str:
        return email


class SecretProduces(Produces):
    """Produces, encrypted: its arguments and its result are stored sealed."""

    encrypted = True


class SecretGathers(Gathers):
    """Gathers, encrypted."""

    encrypted = True


class SecretAsync(Queueable):
    """An encrypted async job: returns what it was given."""

    encrypted = True
    queue = "aio"

    async def handle(self, card: str) -> dict[str, str]:
        return {"card": card}


class SecretLimited(Queueable):
    """An encrypted job with a per-account limit: its concurrency key is stored as returned."""

    encrypted = True
    concurrency_limit = 1

    def concurrency_key(self, account_id: int, email: str) -> str:
        return f"account:{account_id}"

    def handle(self, account_id: int, email: str) -> str:
        return email


class FairWork(Queueable):
    """A tenant's job in the fair queue of tests/settings.py (GATOR_FAIRNESS)."""

    queue = "fair"

    def fairness_key(self, tenant: str, n: int = 0) -> str | None:
        return tenant or None

    def handle(self, tenant: str, n: int = 0) -> None:
        return None


class SecretFields(Queueable):
    """``encrypted`` as a list: only ``email`` is sealed; the account id and note stay in
    clear. Writes the email it was given to the ledger and returns it."""

    encrypted = ["email"]
    queue = "secrets"

    def handle(self, account_id: int, email: str = "", note: str = "") -> dict[str, Any]:
        Execution.objects.create(
            job_id=self.job_id, attempt=self.attempt, pid=os.getpid(), label=email
        )
        return {"sent_to": email}
