"""The soak's job mix (found by the workers' autodiscovery of ``jobs`` modules).

Every job is in the queue ``soak`` but those of the limited queue ``soak-limited`` (its
limit is in settings.GATOR_QUEUES); the harness chooses the mix (``--mix``). The kinds of
this round's features (a keyed class with limits, a limited queue, async jobs, snoozes,
batches with callbacks, workflows) write what the report checks into the ledger tables of
models.py.
"""

from __future__ import annotations

import asyncio
import time

from django.db.models import QuerySet

from benchmarks.soak.app.models import CallbackRun, LimitedRun, StepRun
from django_gator import Queueable, Retry, Snooze
from django_gator.models import Job, JobState

QUEUE = "soak"
LIMITED_QUEUE = "soak-limited"
#: The limits the report checks (settings.GATOR_QUEUES carries LIMITED_CONCURRENCY).
KEY_CONCURRENCY = 2
KEY_RATE = "30/m"
LIMITED_CONCURRENCY = 3


class SoakOk(Queueable):
    """The common case: a short job that succeeds."""

    name = "soak.ok"
    queue = QUEUE

    def handle(self, ms: float = 0.0) -> None:
        if ms:
            time.sleep(ms / 1000)


class SoakRetry(Queueable):
    """Fails its first ``fails`` attempts, then succeeds: retried after 5 s."""

    name = "soak.retry"
    queue = QUEUE
    retry = Retry(interval=5, max_retries=3)

    def handle(self, fails: int = 1) -> None:
        if self.attempt <= fails:
            raise RuntimeError(f"soak: attempt {self.attempt} of {fails} failing attempts")


class SoakDead(Queueable):
    """Always fails: two retries 2 s apart, then dead."""

    name = "soak.dead"
    queue = QUEUE
    retry = Retry(interval=2, max_retries=2)

    def handle(self) -> None:
        raise ValueError("soak: this job always fails")


class SoakTimeout(Queueable):
    """Runs past its 1 s timeout (Python code, so the worker's JobTimeout interrupts it);
    no retry, so it ends dead with JobTimeout."""

    name = "soak.timeout"
    queue = QUEUE
    timeout = 1

    def handle(self, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)


class SoakSlow(Queueable):
    """A slow job that succeeds (I/O wait, as a call to another service would be)."""

    name = "soak.slow"
    queue = QUEUE

    def handle(self, ms: float = 1000.0) -> None:
        time.sleep(ms / 1000)


def _own_row(job: Queueable) -> QuerySet[Job]:
    """The running job's own row, found by its id and state: naming the state lets
    PostgreSQL plan the lookup against the active partition alone on partitioned storage
    (an id alone, ordered as the model is, plans a merge of every partition: 4-5 ms a
    lookup with a day of hourly ones, docs/partitioning.md)."""
    return Job.objects.filter(pk=job.job_id, state=JobState.RUNNING)


def _record_limited(job: Queueable, scope: str, started: float) -> None:
    claimed_at = _own_row(job).values_list("locked_at", flat=True).first()
    LimitedRun.objects.create(
        scope=scope,
        job_id=job.job_id or 0,
        attempt=job.attempt,
        claimed_at=claimed_at,
        started=started,
        ended=time.time(),
    )


class SoakKeyed(Queueable):
    """A call to an account's API: at most KEY_CONCURRENCY at once and KEY_RATE starts per
    account, across every worker."""

    name = "soak.keyed"
    queue = QUEUE
    concurrency_limit = KEY_CONCURRENCY
    rate_limit = KEY_RATE

    def concurrency_key(self, account: int, ms: float = 0.0) -> str:
        return f"account:{account}"

    def handle(self, account: int, ms: float = 0.0) -> None:
        started = time.time()
        time.sleep(ms / 1000)
        _record_limited(self, f"key:{account}", started)


class SoakLimited(Queueable):
    """A job of a queue whose concurrency is limited in GATOR_QUEUES (an export service
    that takes LIMITED_CONCURRENCY at a time)."""

    name = "soak.limited"
    queue = LIMITED_QUEUE

    def handle(self, ms: float = 0.0) -> None:
        started = time.time()
        time.sleep(ms / 1000)
        _record_limited(self, f"queue:{LIMITED_QUEUE}", started)


class SoakAsync(Queueable):
    """An I/O-bound job on the worker's event loop."""

    name = "soak.async"
    queue = QUEUE

    async def handle(self, ms: float = 0.0) -> None:
        await asyncio.sleep(ms / 1000)


class SoakSnooze(Queueable):
    """Not ready at its first run: snoozes once for a second, then succeeds."""

    name = "soak.snooze"
    queue = QUEUE

    def handle(self) -> None:
        snoozes = _own_row(self).values_list("snoozes", flat=True).first()
        if not snoozes:
            raise Snooze(1.0)


class SoakMember(SoakOk):
    """A member of a batch (a short job that succeeds)."""

    name = "soak.member"


class SoakBatchCallback(Queueable, abstract=True):
    """A batch's callback: its ledger row commits with its success mark."""

    queue = QUEUE
    atomic = True
    callback = ""

    def handle(self, batch_id: int) -> None:
        CallbackRun.objects.create(
            batch_id=batch_id, callback=self.callback, job_id=self.job_id or 0, ran_at=time.time()
        )


class SoakBatchComplete(SoakBatchCallback):
    name = "soak.batch_complete"
    callback = "complete"


class SoakBatchSuccess(SoakBatchCallback):
    name = "soak.batch_success"
    callback = "success"


class SoakStep(Queueable):
    """A step of a workflow (the harness dispatches diamonds: a, then b and c, then d); its
    ledger row commits with its success mark."""

    name = "soak.step"
    queue = QUEUE
    atomic = True

    def handle(self, workflow: str, step: str, ms: float = 0.0) -> None:
        started = time.time()
        if ms:
            time.sleep(ms / 1000)
        StepRun.objects.create(
            workflow=workflow,
            step=step,
            job_id=self.job_id or 0,
            started=started,
            ended=time.time(),
        )


class SoakWeb(Queueable):
    """A job a web-like process dispatched (benchmarks/soak/web.py): ``token`` names it in
    the files ledger (app/ledger.py), which gets a line per run; it fails its first
    ``fails`` attempts, then succeeds (retried 2 s later)."""

    name = "soak.web"
    queue = QUEUE
    retry = Retry(interval=2, max_retries=3)

    def handle(self, token: str, fails: int = 0, ms: float = 0.0) -> None:
        from benchmarks.soak.app import ledger

        if ms:
            time.sleep(ms / 1000)
        failing = self.attempt <= fails
        ledger.write("runs", f"{token} {self.attempt} {'fail' if failing else 'ok'}")
        if failing:
            raise RuntimeError(f"soak: attempt {self.attempt} of {fails} failing attempts")


#: Mix names (``--mix ok=95,retry=3,...``) and the job class of each. "batch" and
#: "workflow" are dispatched as batches of SoakMember and workflows of SoakStep (see
#: harness.Soak.dispatch_loop); their weight is in jobs, as every other kind's.
KINDS: dict[str, type[Queueable]] = {
    "ok": SoakOk,
    "retry": SoakRetry,
    "dead": SoakDead,
    "timeout": SoakTimeout,
    "slow": SoakSlow,
    "keyed": SoakKeyed,
    "limited": SoakLimited,
    "async": SoakAsync,
    "snooze": SoakSnooze,
    "batch": SoakMember,
    "workflow": SoakStep,
}
