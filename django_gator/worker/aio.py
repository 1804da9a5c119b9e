"""The event loop of a worker process: ``async def`` jobs run on it, many at once.

One thread (``gator-aio``) runs one asyncio loop per worker process. The fetcher claims for
the loop's free slots beside the executor threads' (see :class:`~.async_slots.AsyncSlots`) and
hands it the async jobs it claimed; each runs as an asyncio task, so a job waiting on I/O
holds no thread. Up to ``--async-concurrency`` run at once.

What is not the handler's own code runs off the loop, in threads:

- sync code the job calls through ``sync_to_async`` (the async ORM does): Django's rule
  for thread-sensitive code sends it to one thread, the *ORM thread*
  (:class:`OrmThread`), shared by every job on the loop (the loop's tasks share one
  asgiref ``ThreadSensitiveContext`` whose executor it is). Each call is watched as an
  executor's job is (:mod:`.hygiene`): a transaction it leaves open is rolled back at
  once and the job that made the call fails with ``TransactionLeftOpen``; the thread's
  connections are closed when the loop stops;
- the job_started and job_finished signals, ``on_error()`` and ``retry_decision()``, and
  sync middleware (see :func:`acall_handle`), also on the ORM thread;
- the outcome writes, by :class:`~.outcomes.Outcomes` as for a thread's job, on a few
  writer threads; a plain success goes back to the slots for the fetcher's batched mark.

A job's ``timeout`` cancels its coroutine (asyncio cancellation: the handler sees
``CancelledError`` at its current ``await``) and the attempt fails with ``JobTimeout``,
retried per the job's policy. A forced stop cancels the running jobs and the worker gives
them back, as it does for jobs still in its threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

from asgiref.sync import (
    SyncToAsync,
    ThreadSensitiveContext,
    async_to_sync,
    iscoroutinefunction,
    sync_to_async,
)
from django.db import close_old_connections

from django_gator import conf, signals
from django_gator.attempts import Outcome, Success
from django_gator.engines import ClaimedJob
from django_gator.exceptions import (
    JobNotRegistered,
    TransactionLeftOpen,
    Undecryptable,
)
from django_gator.joblogs import capturing
from django_gator.longjobs import Journal
from django_gator.queueable import Queueable, get_job_class
from django_gator.worker.execution import (
    BadRow,
    dead_failure,
    finished,
    instance_for,
    raised_outcome,
    stored_result,
    unknown_name_failure,
)
from django_gator.worker.hygiene import ConnectionWatch
from django_gator.worker.outcomes import DEFERRED, Outcomes
from django_gator.worker.progress import journal_for, within_limits
from django_gator.worker.slots import Finished, Slots

logger = logging.getLogger("django_gator.worker")

#: Starts a named thread running a function (the supervisor's, which watches it).
Spawn = Callable[[str, Callable[[], None]], threading.Thread]

#: Threads that write the outcomes of the loop's jobs.
WRITERS = 4
#: Seconds the loop's threads get to close their connections when it stops.
CLOSE_TIMEOUT = 10.0


def runs_async(job: ClaimedJob) -> bool:
    """Whether ``job`` is an async job (its class's handler is ``async def``)."""
    try:
        return get_job_class(job.name).traits.is_async
    except JobNotRegistered:
        return False  # a thread writes its outcome (see unknown_name_failure)


def any_async_jobs() -> bool:
    """Whether a registered job class is async (a worker then starts its loop)."""
    from django_gator.registry import registered_jobs

    return any(cls.traits.is_async for cls in registered_jobs().values())


async def acall_handle(instance: Queueable) -> Any:
    """Await ``handle()`` inside the middleware (GATOR_MIDDLEWARE, then the class's).

    An ``async def`` middleware is awaited on the loop; its ``call_next()`` returns an
    awaitable. A sync middleware runs on the ORM thread, where its ``call_next()`` waits
    for the rest on the loop: it works, but it holds that thread (and so every other
    async job's ORM calls) while the job runs; write middleware for async jobs as
    ``async def``."""
    layers = [*conf.middleware(), *type(instance).middleware]
    journal = instance._gator_journal
    if journal is not None and journal.logs is not None:
        with capturing(journal.logs):  # this task's records (and its sync calls')
            return await _call_layers(instance, layers)
    return await _call_layers(instance, layers)


async def _call_layers(instance: Queueable, layers: list[Any]) -> Any:
    async def call(index: int) -> Any:
        if index == len(layers):
            return await instance.handle(*instance.args, **instance.kwargs)
        layer = layers[index]
        if iscoroutinefunction(layer):
            return await layer(instance, lambda: call(index + 1))
        rest = async_to_sync(call)
        return await sync_to_async(layer)(instance, lambda: rest(index + 1))

    return await call(0)


class Threads(Executor):
    """A few threads that the worker spawns (so each closes its database connections when
    it ends, as every worker thread does), running what is submitted, in order."""

    def __init__(self, spawn: Spawn, name: str, count: int) -> None:
        self.spawn = spawn
        self.name = name
        self.count = count
        self.queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(1, self.count + 1):
            self.threads.append(self.spawn(f"{self.name}-{number}", self._work))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.queue.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self.threads:
            self.queue.put(None)
        if wait:
            for thread in self.threads:
                thread.join(CLOSE_TIMEOUT)


#: The job whose task is calling (set in each job's task; read where its sync calls go).
_current_job: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "gator_current_job", default=None
)


class OrmThread(Executor):
    """The thread where the loop's jobs' sync code runs (Django's thread-sensitive rule;
    the loop's ThreadSensitiveContext uses this executor). Every call is watched as an
    executor thread's job is (:mod:`.hygiene`): a transaction it leaves open is rolled back
    at once, before another job's call could join it, and the job that made the call is
    told when it ends (:meth:`problems`)."""

    def __init__(self, spawn: Spawn) -> None:
        self.pool = Threads(spawn, "gator-aio-orm", 1)
        self.left: dict[int, list[str]] = {}  # by job id: what its calls left open

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        # Called on the loop, in the calling job's task: the job is known here.
        return self.pool.submit(self._call, _current_job.get(), fn, args, kwargs)

    def _call(self, job_id: int | None, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        watch = ConnectionWatch()
        try:
            with watch:
                return fn(*args, **kwargs)
        finally:
            left = watch.clean()
            if left:
                logger.warning(
                    "Async job left %s; rolled back and reconnected id=%s",
                    " and ".join(left),
                    job_id,
                )
                if job_id is not None:
                    self.left.setdefault(job_id, []).extend(left)
            elif watch.used():
                close_old_connections()  # as around an executor's job

    def problems(self, job_id: int) -> list[str]:
        """What the calls of job ``job_id`` left open (on the loop, once the job ended)."""
        return self.left.pop(job_id, [])

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def context(self) -> ThreadSensitiveContext:
        """The asgiref context that sends thread-sensitive calls here (enter it first)."""
        if "executor" in inspect.signature(ThreadSensitiveContext).parameters:
            return ThreadSensitiveContext(executor=self)
        return _ContextWithExecutor(self)  # asgiref < 3.13


class _ContextWithExecutor(ThreadSensitiveContext):
    """ThreadSensitiveContext(executor=...) for asgiref before 3.13, which pick a context's
    executor from the same map."""

    def __init__(self, executor: Executor) -> None:
        super().__init__()
        self._gator_executor = executor

    async def __aenter__(self) -> ThreadSensitiveContext:
        entered = await super().__aenter__()
        SyncToAsync.context_to_thread_executor[self] = self._gator_executor
        return entered


async def arun_claimed(
    job: ClaimedJob, worker_id: str, orm: OrmThread, journal: Journal | None = None
) -> Outcome:
    """:func:`~.execution.run_claimed` for an async job, on the loop. Raises
    CancelledError only when the worker cancels the job (a forced stop). ``journal``:
    its progress and checkpoint (the caller writes them at the end)."""
    instance: Queueable | None = None
    started = time.perf_counter()
    raised: BaseException | None = None
    outcome: Outcome | None = None
    _current_job.set(job.id)  # this task's context: its sync calls carry it
    try:
        instance = instance_for(job, journal)
        job_class = type(instance)
        if signals.job_started.has_listeners(job_class):
            await sync_to_async(signals.send)(signals.job_started, job_class, job=instance)
        result = await within_limits(instance, acall_handle)
        outcome = Success(stored_result(job, instance, result))
    except JobNotRegistered as exc:
        return unknown_name_failure(job, worker_id, exc)
    except (BadRow, Undecryptable) as exc:
        return dead_failure(job, worker_id, exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the worker cancelled it
        raised = exc  # the job's own (a subtask's cancellation it let through)
    except BaseException as exc:
        raised = exc
    leftovers = orm.problems(job.id)
    if leftovers and raised is None:
        raised = TransactionLeftOpen(
            f"a sync call of the job left {' and '.join(leftovers)}; its uncommitted writes "
            "were rolled back. End every transaction inside the function given to "
            "sync_to_async (transaction.atomic() does)."
        )
    if raised is not None:
        outcome = await sync_to_async(raised_outcome)(job, worker_id, raised, instance)
    assert outcome is not None
    if instance is not None and signals.job_finished.has_listeners(type(instance)):
        await sync_to_async(finished)(instance, outcome, time.perf_counter() - started)
    return outcome


class AsyncRunner:
    """The loop thread of one worker, and the threads it writes outcomes with."""

    def __init__(
        self,
        slots: Slots,
        outcomes: Outcomes,
        spawn: Spawn,
    ) -> None:
        self.slots = slots
        self.outcomes = outcomes
        self.spawn = spawn
        # Made by start(): a worker that never starts leaves no loop to close.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.intake: asyncio.Queue[list[ClaimedJob] | None] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.orm = OrmThread(spawn)
        self.writers = Threads(spawn, "gator-aio-writer", WRITERS)
        self.thread: threading.Thread | None = None
        self.ready = threading.Event()

    # -- from the worker's threads ---------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.orm.pool.start()
        self.writers.start()
        self.thread = self.spawn("gator-aio", self._thread)
        self.ready.wait(CLOSE_TIMEOUT)

    def submit(self, jobs: Sequence[ClaimedJob]) -> None:
        """Start these jobs on the loop (any thread)."""
        if jobs and self.loop is not None:
            self.loop.call_soon_threadsafe(self.intake.put_nowait, list(jobs))

    def close(self, *, cancel: bool = False) -> None:
        """Stop the loop once its jobs are done (``cancel``: cancel them first), close the
        connections of its threads, and wait for them."""
        if self.thread is None or self.loop is None:
            return
        if cancel:
            self.loop.call_soon_threadsafe(self._cancel_all)
        self.loop.call_soon_threadsafe(self.intake.put_nowait, None)
        self.thread.join(CLOSE_TIMEOUT)
        self.writers.shutdown(wait=True)

    # -- the loop thread -------------------------------------------------------------------
    def _thread(self) -> None:
        loop = self.loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        async with self.orm.context():  # one ORM thread for every job of the loop
            self.ready.set()
            while (jobs := await self.intake.get()) is not None:
                for job in jobs:
                    self._start(job)
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        self.orm.shutdown()  # its thread closes its connections as it ends

    def _cancel_all(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def _run(self, job: ClaimedJob) -> None:
        started = time.perf_counter()
        worker_id = self.outcomes.worker_id
        journal = journal_for(
            job,
            self.outcomes.engine,
            worker_id,
            stopping=lambda: self.slots.stopping,
            submit=self.writers.submit,
        )
        try:
            outcome = await arun_claimed(job, worker_id, self.orm, journal)
            if journal.pending:  # before the outcome: a hand-back's position
                await self._write(journal.flush)
            elapsed_ms = (time.perf_counter() - started) * 1000
            state = await self._write(self.outcomes.record, job, outcome, elapsed_ms, batch=True)
        except asyncio.CancelledError:
            return  # a forced stop: the worker gives the job back
        except BaseException as exc:
            logger.exception("Async executor error id=%s", job.id)
            try:
                await self._write(self.outcomes.worker_error, job, exc)
            except BaseException:
                logger.exception("Could not record the failure of job id=%s", job.id)
            self._finish(job, None)
            return
        if state == DEFERRED and isinstance(outcome, Success):
            self._finish(job, (job, outcome, elapsed_ms))
        else:
            self._finish(job, None)

    def _finish(self, job: ClaimedJob, finished: Finished | None) -> None:
        """Hand the job back to the slots; start the async job that waited for its slot."""
        following = self.slots.finish_async(job, finished)
        if following is not None:
            self._start(following)

    def _start(self, job: ClaimedJob) -> None:
        task = asyncio.create_task(self._run(job), name=f"gator-job-{job.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an outcome write on a writer thread."""

        def run() -> Any:
            close_old_connections()
            return write(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self.writers, run)
