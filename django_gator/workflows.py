"""Workflows: a graph of jobs, each run once all the steps it comes after have succeeded.

::

    wf = Workflow(name=f"order {order.id}")
    fetch_a = wf.add(FetchSource, "a")
    fetch_b = wf.add(FetchSource, "b")
    merge = wf.add(MergeSources, order.id, after=[fetch_a, fetch_b])
    wf.add(NotifyUser, order.id, after=[merge])
    wf.dispatch()

:meth:`Workflow.dispatch` checks the graph (no cycle, every dependency a step of this
workflow) and inserts it in one transaction: the workflow's row, one row per step, and
the job rows of the steps that wait for nothing. The other steps get their job rows when
their last dependency succeeds, in the transaction that marks it succeeded (see
:mod:`django_gator.models.settling`). A step whose job ends ``dead`` cancels every step
that depends on it, directly or not (each records which step died), unless it was added
with ``on_dead="continue"``: then its dependents go on as if it had succeeded.

A step may itself be a batch (:meth:`Workflow.add_batch`): many jobs of one class, all
due once the step's ``after`` steps succeeded, run in parallel. The step succeeds when
every member has; a member that ends dead or cancelled ends the step so (cancelling its
dependents, unless ``on_dead="continue"``); a retried member that then succeeds brings
the step, and what it cancelled, back. Members that are only known at run time are added
by a member itself, while it runs (``self.batch().add_many(...)``): a step of one member
that fans out.

A :class:`~django_gator.chain.Chain` is a workflow whose steps form a line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_gator import conf, validation
from django_gator.items import dispatch_items
from django_gator.jobfunction import JobFunction, resolve_job_class
from django_gator.queueable import Queueable
from django_gator.workflow_specs import StepSpec, step_specs
from django_gator.workflow_steps import STEP_NAME_MAX_LENGTH, Step, check_step_name, find_cycle
from django_gator.workflow_waits import NO_TIMEOUT_SECONDS, SleepStep, WaitStep

if TYPE_CHECKING:
    from django_gator.models import WorkflowRun

#: on_dead values (see Workflow.add).
ON_DEAD = ("cancel", "continue")
#: Most steps in one workflow (a step's position is a small integer on its job row).
MAX_STEPS = 32767


class Workflow:
    """A graph of steps; build it with :meth:`add`, insert it with :meth:`dispatch`."""

    def __init__(
        self, name: str = "", *, on_error: type[Queueable] | JobFunction | None = None
    ) -> None:
        if not isinstance(name, str) or len(name) > 200:
            raise ValueError(
                f"a workflow's name is a str of at most 200 characters, got "
                f"{validation.short_repr(name)}"
            )
        self.name = name
        #: Dispatched with (workflow id, job id) when a step ends dead (and cancels).
        self.on_error = resolve_job_class(on_error) if on_error is not None else None
        if self.on_error is not None:
            self.on_error.check_arguments(["workflow-id", 1], {})
        self.steps: list[Step] = []
        #: The WorkflowRun row once dispatched.
        self.run: WorkflowRun | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, {len(self.steps)} steps)"

    def add(
        self,
        job: type[Queueable] | JobFunction,
        *args: Any,
        after: Iterable[Step | str] = (),
        on_dead: str = "cancel",
        name: str | None = None,
        **kwargs: Any,
    ) -> Step:
        """Add a step that runs ``job(*args, **kwargs)`` once every step in ``after`` (steps,
        or names of steps added before) has succeeded. ``on_dead``: ``"cancel"`` (default),
        a dead end of this step cancels every step after it; ``"continue"``, they treat it
        as satisfied. ``name``: the step's name (default: its position, ``"0"``, ``"1"``...),
        which later steps may put in ``after`` and under which its result reaches its
        dependents' ``self.results()``. (``after``, ``on_dead`` and ``name`` are this
        method's: a job argument of one of those names cannot be given here.)"""
        return self.add_step(job, args, kwargs, after=after, on_dead=on_dead, name=name)

    def add_step(
        self,
        job: type[Queueable] | JobFunction,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        after: Iterable[Step | str] = (),
        on_dead: str = "cancel",
        name: str | None = None,
    ) -> Step:
        """:meth:`add`, with the job's arguments as a list and a dict (so that any keyword
        argument reaches the job, ``name`` and ``after`` included)."""
        job_class = self._check_step(job, after, on_dead)
        job_class.check_arguments(args, kwargs)
        step = Step(
            self,
            len(self.steps),
            job_class,
            tuple(args),
            dict(kwargs),
            self._resolve(after),
            on_dead,
            name=check_step_name(self, name),
        )
        self.steps.append(step)
        return step

    def add_sleep(
        self,
        duration: timedelta | float | None = None,
        *,
        at: datetime | None = None,
        after: Iterable[Step | str] = (),
        name: str | None = None,
        queue: str | None = None,
    ) -> Step:
        """Add a step that waits ``duration`` (a timedelta or seconds) from the moment the
        steps in ``after`` have succeeded, or until ``at``, then succeeds. It holds no
        worker thread: its job row is due when it ends, and a restart changes nothing.
        ``queue``: the queue of that row (default: the first ``after`` step's, else
        ``default``); a worker of that queue ends the sleep."""
        if (duration is None) == (at is None):
            raise ValueError("add_sleep() takes a duration or at=, one of them")
        delay = None if duration is None else _seconds(duration, "add_sleep()'s duration")
        due_at = None if at is None else validation.resolve_when(wait=None, at=at)
        if queue is not None:
            validation.validate_queue(queue)
        step = self.add_step(SleepStep, (), {}, after=after, name=name)
        step.delay, step.due_at = delay, due_at
        self._set_queue(step, queue)
        return step

    def add_wait(
        self,
        signal: str,
        *,
        after: Iterable[Step | str] = (),
        timeout: timedelta | float | None = None,
        on_timeout: type[Queueable] | JobFunction | None = None,
        name: str | None = None,
        queue: str | None = None,
    ) -> Step:
        """Add a step that waits for the signal ``signal`` (``WorkflowRun.signal``,
        ``gator_workflow signal``, the admin's Approve), once the steps in ``after`` have
        succeeded; the signal's payload is its result. A signal sent before the step is
        reached is kept. ``timeout``: with no signal by then, ``on_timeout`` (a job class,
        called with the workflow's id and the signal's name) runs in the wait's place and
        its result is the wait's; without ``on_timeout`` the wait ends dead and cancels
        the steps after it. ``queue``: as for :meth:`add_sleep`."""
        if not isinstance(signal, str) or not signal or len(signal) > STEP_NAME_MAX_LENGTH:
            raise ValueError(
                f"a signal's name is a non-empty str of at most {STEP_NAME_MAX_LENGTH} "
                f"characters, got {validation.short_repr(signal)}"
            )
        if any(step.wait_for == signal for step in self.steps):
            raise ValueError(f"{self!r} waits for the signal {signal!r} already")
        kwargs: dict[str, Any] = {}
        if on_timeout is not None:
            handler = resolve_job_class(on_timeout)
            handler.check_arguments(["workflow-id", signal], {})
            kwargs["on_timeout"] = handler.name
        delay = NO_TIMEOUT_SECONDS if timeout is None else _seconds(timeout, "add_wait()'s timeout")
        if queue is not None:
            validation.validate_queue(queue)
        step = self.add_step(WaitStep, (signal,), kwargs, after=after, name=name)
        step.wait_for, step.delay = signal, delay
        self._set_queue(step, queue)
        return step

    def _set_queue(self, step: Step, queue: str | None) -> None:
        """A sleep's or a wait's queue: ``queue``, else its first ``after`` step's."""
        first = step.after[0] if step.after else None
        if queue is None and isinstance(first, Step):
            queue = first.queue or first.job_class.queue  # a sleep after a wait: the wait's
        step.queue = queue

    def _resolve(self, after: Iterable[Step | str]) -> list[Any]:
        """``after`` with each name replaced by the step of that name (added before);
        anything else is kept for check() to judge."""
        if isinstance(after, (Step, str, bytes)):
            raise TypeError(f"after= takes a list of steps, got {validation.short_repr(after)}")
        by_name = {step.name: step for step in self.steps}
        resolved: list[Any] = []
        for dependency in after:
            if isinstance(dependency, str):
                if dependency not in by_name:
                    known = ", ".join(repr(n) for n in by_name) or "none yet"
                    raise ValueError(
                        f"{self!r} has no step named {dependency!r} (steps so far: {known}); "
                        "a step can only come after steps added before it"
                    )
                resolved.append(by_name[dependency])
            else:
                resolved.append(dependency)
        return resolved

    def _check_step(
        self, job: type[Queueable] | JobFunction, after: Iterable[Step | str], on_dead: str
    ) -> type[Queueable]:
        if self.run is not None:
            raise ValueError(f"{self!r} was dispatched already; build a new Workflow")
        job_class = resolve_job_class(job)
        if on_dead not in ON_DEAD:
            raise ValueError(
                f"on_dead must be 'cancel' or 'continue', got {validation.short_repr(on_dead)}"
            )
        return job_class

    def add_batch(
        self,
        job: type[Queueable] | JobFunction,
        items: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        after: Iterable[Step | str] = (),
        on_dead: str = "cancel",
        name: str | None = None,
    ) -> Step:
        """Add a step that is a batch: one job of ``job`` per item of ``items`` (a list of
        positional arguments or a dict of keyword arguments, as for ``dispatch_many``),
        all due at once when every step in ``after`` has succeeded. The step succeeds when
        every member has succeeded. ``on_dead="cancel"`` (default): a member that ends dead
        ends the step dead and cancels every step after it; ``"continue"``: they run once
        every member has ended, as if it had succeeded. A member may add more members while
        it runs (``self.batch().add_many(...)``). An empty step, or one of more than
        ``GATOR_MAX_BATCH_SIZE`` members, is refused at dispatch."""
        job_class = self._check_step(job, after, on_dead)
        step = Step(
            self,
            len(self.steps),
            job_class,
            (),
            {},
            self._resolve(after),
            on_dead,
            [],
            name=check_step_name(self, name),
        )
        members = dispatch_items(items, f"{step.label()}: add_batch()")
        for index, (args, kwargs) in enumerate(members):
            try:
                job_class.check_arguments(args, kwargs)
            except TypeError as exc:
                raise TypeError(f"{step.label()}, batch item {index}: {exc}") from None
        step.members = members
        self.steps.append(step)
        return step

    def check(self) -> None:
        """Refuse a graph that cannot run: no step, too many, a dependency that is not a
        step of this workflow, or a cycle; the error names the value."""
        if not self.steps:
            raise ValueError(f"{self!r} has no step; add one before dispatch()")
        if len(self.steps) > MAX_STEPS:
            raise ValueError(f"{self!r} has {len(self.steps)} steps, over {MAX_STEPS}")
        for step in self.steps:
            for dependency in step.after:
                if not isinstance(dependency, Step):
                    raise TypeError(
                        f"{step.label()} of {self!r} depends on "
                        f"{validation.short_repr(dependency)}, which is not a step "
                        "(pass what Workflow.add() returned)"
                    )
                if dependency.workflow is not self:
                    raise ValueError(
                        f"{step.label()} of {self!r} depends on {dependency.label()} of "
                        f"another workflow, {dependency.workflow!r}"
                    )
        cycle = find_cycle(self.steps)
        if cycle:
            raise ValueError(
                f"{self!r} has a cycle: " + " -> ".join(step.label() for step in cycle)
            )
        limit = conf.max_batch_size()
        for step in self.steps:
            if step.members is None:
                continue
            if not step.members:
                raise ValueError(
                    f"{step.label()} of {self!r} is a batch with no member; give add_batch() "
                    "at least one item (a member can add more while it runs)"
                )
            if len(step.members) > limit:
                raise ValueError(
                    f"{step.label()} of {self!r} is a batch of {len(step.members)} members, "
                    f"more than GATOR_MAX_BATCH_SIZE = {limit}"
                )

    def dispatch(
        self,
        *,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
    ) -> WorkflowRun:
        """Check the graph and insert it (inside the caller's transaction, or after it
        commits with ``on_commit`` as for ``dispatch``); returns its WorkflowRun row.
        ``wait``/``at`` delay the steps that wait for nothing; ``queue``/``priority``
        override every step's."""
        specs, run_at = self._specs(wait, at, queue, priority)
        return self._insert(specs, run_at, on_commit)

    async def adispatch(
        self,
        *,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
    ) -> WorkflowRun:
        """:meth:`dispatch` for async code: the graph and the arguments are checked here,
        on the event loop, so a bad workflow raises before any thread is used; the INSERTs
        then run through ``sync_to_async(thread_sensitive=True)``, in the thread of the
        caller's transaction (as :func:`django_gator.dispatch.aenqueue` does)."""
        from asgiref.sync import sync_to_async

        specs, run_at = self._specs(wait, at, queue, priority)
        return await sync_to_async(self._insert, thread_sensitive=True)(specs, run_at, on_commit)

    def _specs(
        self,
        wait: timedelta | float | None,
        at: datetime | None,
        queue: str | None,
        priority: int | None,
    ) -> tuple[list[StepSpec], datetime | None]:
        """Check the graph and the options, serialize every step (no database access)."""
        if self.run is not None:
            raise ValueError(f"{self!r} was dispatched already")
        self.check()
        if queue is not None:
            validation.validate_queue(queue)
        if priority is not None:
            validation.validate_priority(priority)
        specs = step_specs(self.steps, queue, priority)
        return specs, validation.resolve_when(wait=wait, at=at)

    def _insert(
        self, specs: list[StepSpec], run_at: datetime | None, on_commit: bool | str | None
    ) -> WorkflowRun:
        # Here, not at the top: it imports the models, and `import django_gator` (which
        # imports this module) must not. Not an import cycle.
        from django_gator.pipeline.workflow import dispatch_workflow

        run, roots, batches = dispatch_workflow(
            self.name,
            self.on_error.name if self.on_error else "",
            specs,
            run_at=run_at,
            on_commit=on_commit,
        )
        self.run = run
        for step in self.steps:
            step.job = roots.get(step.position)
            step.batch = batches.get(step.position)
        return run


def _seconds(value: timedelta | float, what: str) -> float:
    """``value`` in seconds, positive; the error names it."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"{what} must be a positive timedelta or number of seconds, got {value!r}")
    return float(seconds)
