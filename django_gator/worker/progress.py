"""The journal of an attempt the worker runs (see :mod:`django_gator.longjobs`): its
progress and checkpoint written through the engine, on the claim, and counted in the
metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django_gator import conf, encryption, metrics
from django_gator.attempts import Claim
from django_gator.engines import ClaimedJob, JobEngine
from django_gator.exceptions import JobNotRegistered, JobStalled, JobTimeout
from django_gator.joblogs import buffer_for
from django_gator.longjobs import Journal
from django_gator.queueable import Queueable, effective_timeout, get_job_class
from django_gator.redaction import is_encrypted, secret_values
from django_gator.validation import dumps


def journal_for(
    job: ClaimedJob,
    engine: JobEngine,
    worker_id: str,
    *,
    stopping: Callable[[], bool] = lambda: False,
    submit: Callable[[Callable[[], Any]], Any] | None = None,
) -> Journal:
    """A journal writing ``job``'s progress, checkpoint and captured logs on this claim
    of ``worker_id``'s. ``submit``: where an async job's writes run (see Journal)."""
    claim = Claim.of(job)

    def write(progress: str | None, checkpoint: str | None, logs: str | None) -> bool:
        if checkpoint is not None and is_encrypted(job.name):
            checkpoint = encryption.seal_json(checkpoint)
        return engine.save_progress(worker_id, claim, progress, checkpoint, logs)

    def load() -> str | None:
        text = engine.read_checkpoint(job.id)
        if text is None or not text.startswith("{"):
            return text
        state = json.loads(text)
        if not encryption.is_sealed(state):
            return text
        opened = encryption.open_value(state, f"the checkpoint of job {job.id} ({job.name})")
        return json.dumps(opened, separators=(",", ":"), ensure_ascii=False)

    def counted(delta: float) -> None:
        if metrics.enabled:
            metrics.job_progress(job, delta)

    try:
        job_class = get_job_class(job.name)
    except JobNotRegistered:  # its attempt fails before it runs
        buffer = None
    else:
        # An encrypted class's log lines may hold its data in clear: not captured.
        buffer = None if job_class.traits.encrypted else buffer_for(job_class)

    def log_entry() -> str:
        assert buffer is not None
        secrets = secret_values(job.name, job.args, job.kwargs)
        return dumps(buffer.entry(attempt=job.attempts, worker=worker_id, secrets=secrets))

    return Journal(
        write,
        load,
        interval=conf.progress_interval(),
        stopping=stopping,
        submit=submit,
        on_progress=counted,
        logs=buffer,
        log_entry=log_entry,
    )


async def within_limits(instance: Queueable, handle: Callable[[Queueable], Awaitable[Any]]) -> Any:
    """Await ``handle(instance)`` (an async job's handler), cancelled after its class's
    ``timeout`` (or GATOR_DEFAULT_TIMEOUT: JobTimeout then), or when its journal shows no
    sign of life for its ``stall_timeout`` (JobStalled)."""
    stall = type(instance).stall_timeout
    if stall is None:
        return await _within_timeout(instance, handle)
    journal = instance._journal()
    task = asyncio.ensure_future(_within_timeout(instance, handle))
    try:
        while True:
            left = journal.active_at + stall - time.monotonic()
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    except asyncio.CancelledError:
        task.cancel()  # the worker cancelled the job: its handler too
        raise
    task.cancel()
    await asyncio.wait({task})  # its end, whatever it raised (a cancel of ours still raises)
    raise JobStalled(
        f"no progress(), checkpoint() or heartbeat() for {stall:g} s (its stall_timeout)"
    )


async def _within_timeout(
    instance: Queueable, handle: Callable[[Queueable], Awaitable[Any]]
) -> Any:
    timeout = effective_timeout(type(instance))
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            result = await handle(instance)
    except TimeoutError as exc:
        if not scope.expired():
            raise  # the job's own TimeoutError
        raise JobTimeout(f"job ran longer than its timeout of {timeout:g} s") from exc
    if scope.expired():  # the job swallowed the cancellation and went on
        raise JobTimeout(f"job ran longer than its timeout of {timeout:g} s")
    return result
