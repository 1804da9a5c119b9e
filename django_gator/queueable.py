"""Job classes: :class:`Queueable`, which a job subclasses (``@job`` builds one around a
function: :mod:`django_gator.jobfunction`).

A job class registers itself in :mod:`django_gator.registry` when it is defined. Its
``dispatch()`` and ``cancel_requested()`` reach the dispatch code and the models through
imports inside those methods: ``import django_gator`` (which imports this module) must not
import the models, since settings modules and models modules import it before Django's apps
are ready.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django_gator import conf
from django_gator.databases import for_queue
from django_gator.items import dispatch_items
from django_gator.longjobs import LongRunning

# The registry's functions are still importable from here, where they were first.
from django_gator.registry import get_job_class as get_job_class
from django_gator.registry import is_registered as is_registered
from django_gator.registry import register
from django_gator.registry import registered_jobs as registered_jobs
from django_gator.registry import unregister as unregister
from django_gator.retry import Interval, Retry
from django_gator.traits import JobTraits, read_traits
from django_gator.windows import Windows

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from django_gator.models import Batch, Job

#: A middleware: called as ``middleware(job, call_next)``; returns what ``call_next()`` returns.
Middleware = Callable[[Any, Callable[[], Any]], Any]

#: Argument shapes (count of positional arguments, names of keyword ones) remembered per
#: job class as fitting handle(); a class called with more shapes binds the others each time.
MAX_SHAPES = 1000


class Queueable(Windows, LongRunning):
    """Base class of a job: subclass it, write ``handle()``, then ``MyJob.dispatch(...)``.

    Class attributes set the defaults of every dispatch:

    ``name``: the registered job name (default ``"module.QualName"``).
    ``queue``: queue name (default ``"default"``).
    ``priority``: -100 to 100, higher runs first within a queue (default 0).
    ``retry``: a :class:`~django_gator.Retry` policy; None sends a failing job to ``dead``.
    ``timeout``: seconds a run may take; None: ``GATOR_DEFAULT_TIMEOUT`` (see effective_timeout).
    ``unique``: True allows one waiting, failed or running job per set of arguments (or
    per :meth:`unique_key`); a dispatch while one exists returns that job. ``unique_for``,
    ``debounce``, ``throttle``, ``expires``: see :mod:`django_gator.windows`.
    ``atomic``: True runs ``handle()`` and the success mark in one transaction on the
    jobs database, so effects written there apply exactly once.
    ``middleware``: callables ``(job, call_next)`` wrapped around ``handle()``, inside
    the ones of ``GATOR_MIDDLEWARE``.
    ``schedule``: a cron string, a :class:`~django_gator.schedules.Cron`, or a list of
    them: workers dispatch the job at each occurrence.
    ``concurrency_limit``: at most this many of its jobs run at once across every worker,
    per key when the class defines :meth:`concurrency_key` (else for the class).
    ``rate_limit``: at most this many starts per window, ``"100/m"`` (``/s``, ``/m``,
    ``/h``), per key when the class defines :meth:`concurrency_key`.
    ``stall_timeout``: seconds without progress, checkpoint or heartbeat after which an
    attempt fails with JobStalled (see :mod:`django_gator.longjobs`).

    Read, never set: ``traits``, a :class:`~django_gator.traits.JobTraits` worked out when
    the class is defined (is it async, unique, limited, keyed; its handler's signature).

    While ``handle()`` runs, ``self.job_id``, ``self.attempt`` (1 for the first run),
    ``self.queue``, ``self.args`` and ``self.kwargs`` describe the job being run.
    """

    name: ClassVar[str]
    queue: str = "default"
    priority: ClassVar[int] = 0
    retry: ClassVar[Retry | None] = None
    timeout: ClassVar[float | None] = None
    atomic: ClassVar[bool] = False
    middleware: ClassVar[Sequence[Middleware]] = ()
    schedule: ClassVar[Any] = None
    concurrency_limit: ClassVar[int | None] = None
    rate_limit: ClassVar[str | None] = None
    #: Argument keys (besides GATOR_REDACT) never shown in the admin or in log lines.
    redact: ClassVar[Sequence[str]] = ()
    #: Arguments, result, checkpoint and error texts encrypted at rest (docs/encryption.md);
    #: a list of keyword argument names: only those arguments, with the rest as for True.
    encrypted: ClassVar[bool | Sequence[str]] = False
    #: Seconds between two database reads of cancel_requested().
    cancel_check_interval: ClassVar[float] = 1.0

    #: What the class is (async, unique, limited, keyed; its handler's signature), read
    #: from its definition when it is defined: see :class:`~django_gator.traits.JobTraits`.
    traits: ClassVar[JobTraits]
    #: True in a base class whose dispatch options never travel with the arguments (a
    #: Django task's), so that handle() may have parameters named like them.
    _options_apart_from_arguments: ClassVar[bool] = False
    _gator_fits: ClassVar[set[int | tuple[Any, ...]]]  # argument shapes that bind

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        if "name" not in cls.__dict__:
            cls.name = f"{cls.__module__}.{cls.__qualname__}"
        traits = read_traits(cls, Queueable)
        cls.middleware = tuple(cls.middleware)
        cls.traits = traits
        cls._gator_fits = set()
        register(cls)

    @classmethod
    def _handler_is_async(cls) -> bool:
        """Whether the handler is ``async def`` (the worker then runs it on its loop)."""
        return inspect.iscoroutinefunction(cls.handle)

    @classmethod
    def _handler_signature(cls) -> inspect.Signature:
        signature = inspect.signature(cls.handle)
        # Drop `self`.
        params = list(signature.parameters.values())[1:]
        return signature.replace(parameters=params)

    def __init__(
        self,
        *,
        job_id: int | None = None,
        attempt: int = 1,
        queue: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ):
        self.job_id = job_id
        self.attempt = attempt
        self.queue = queue if queue is not None else type(self).queue
        self.args = list(args)
        self.kwargs = dict(kwargs or {})
        self._cancel_seen = False
        self._cancel_checked_at = -math.inf

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def concurrency_key(self, *args: Any, **kwargs: Any) -> str | None:
        """The key this job's ``concurrency_limit`` and ``rate_limit`` count it under,
        computed at dispatch from the job's arguments (``f"account:{account_id}"``); None
        exempts the job from the class's limits. Not overridden: the class is one key."""
        return ""

    def fairness_key(self, *args: Any, **kwargs: Any) -> str | None:
        """The tenant this job is counted under in a fair queue (``GATOR_FAIRNESS``), from
        its arguments at dispatch (``f"tenant:{account_id}"``); None: the queue's keyless
        tenant. See docs/fairness.md."""
        return None

    def on_error(self, exc: BaseException) -> None:
        """Called in the worker after each failed attempt (``self.attempt`` tells which),
        before the failure is written. What it raises is logged and otherwise ignored."""

    def cancel_requested(self) -> bool:
        """Whether someone asked to cancel this running job (``Job.cancel()`` or the admin).

        Check it between units of work and return, or raise :class:`JobCancelled`; the job
        then ends ``cancelled``. Reads the database at most once per
        ``cancel_check_interval`` seconds; once True it stays True.
        """
        if self._cancel_seen or self.job_id is None:
            return self._cancel_seen
        now = time.monotonic()
        if now - self._cancel_checked_at < type(self).cancel_check_interval:
            return False
        self._cancel_checked_at = now
        # Imported here, not at the top: `import django_gator` imports this module and must
        # not import the models (see the module's docstring). Not an import cycle.
        from django_gator.models import Job

        rows = Job.objects.using(for_queue(self.queue))
        self._cancel_seen = rows.filter(pk=self.job_id, cancel_requested=True).exists()
        return self._cancel_seen

    def batch(self) -> Batch | None:
        """The batch this running job is a member of (None if it is in none). Its
        ``add()`` and ``add_many()`` dispatch more members, even into a closed batch (it
        cannot complete while this job runs): a workflow's batch step fans out this way,
        its members only known once a member runs. Make such a job ``atomic`` so that a
        retried attempt does not add its members twice. It reads the database: from an
        ``async def handle()``, call it (and the dispatches) through ``sync_to_async``."""
        if self.job_id is None:
            return None
        from django_gator.models import Batch  # see cancel_requested

        return Batch.of_member(self.job_id, for_queue(self.queue))

    def results(self) -> dict[str, Any]:
        """In a workflow step (or a chain's job): the results of the steps it comes after,
        ``{step name: result}`` (a batch step's: its members' results in the order they
        were added); empty for a job outside a workflow or a first step. It reads the
        database: from an ``async def handle()``, call it through ``sync_to_async``."""
        from django_gator.step_results import parent_results  # see cancel_requested

        return parent_results(self.job_id, for_queue(self.queue))

    async def acancel_requested(self) -> bool:
        """:meth:`cancel_requested` for an ``async def`` handler (its database read runs
        in a thread, as the async ORM's do)."""
        if self._cancel_seen or self.job_id is None:
            return self._cancel_seen
        if time.monotonic() - self._cancel_checked_at < type(self).cancel_check_interval:
            return False
        from asgiref.sync import sync_to_async  # with the ORM call below: see cancel_requested

        return await sync_to_async(self.cancel_requested)()

    def retry_decision(self, exc: BaseException, retry_count: int) -> Interval | bool | None:
        """Decide what happens after ``handle()`` raised ``exc``.

        Return seconds to wait, ``"exponential"``, or ``False`` to send the job to ``dead``
        now; ``None`` (the default) applies the class's ``retry`` policy. ``retry_count`` is
        how many retries the job has had before this failure (0 after the first attempt).
        The policy's ``max_retries`` still caps the number of retries.
        """
        return None

    @classmethod
    def check_arguments(cls, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise TypeError if ``handle()`` could not be called with these arguments."""
        traits = cls.traits
        if traits.accepts_anything and (not kwargs or len(traits.signature.parameters) == 2):
            return
        # Whether arguments bind depends only on how many positional ones there are and
        # the names of the keyword ones: a shape that fitted once fits again (dispatch_many
        # of 100,000 rows binds once, not 100,000 times).
        shape = (len(args), *kwargs) if kwargs else len(args)
        fits = cls._gator_fits
        if shape in fits:
            return
        try:
            traits.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{cls.name}: arguments do not fit handle(): {exc}") from None
        if len(fits) < MAX_SHAPES:
            fits.add(shape)

    @classmethod
    def misfits(cls, args_col: list[list[Any]], kwargs_col: list[dict[str, Any]]) -> list[int]:
        """The indexes, in order, of the (args, kwargs) pairs that :meth:`check_arguments`
        refuses. Asked once per shape of arguments (see there), not once per pair, unless
        a subclass has its own check_arguments."""
        if cls.check_arguments.__func__ is not Queueable.check_arguments.__func__:  # type: ignore[attr-defined]
            return [
                index
                for index, (args, kwargs) in enumerate(zip(args_col, kwargs_col, strict=True))
                if not _fits(cls, args, kwargs)
            ]
        if any(kwargs_col):
            shapes: list[Any] = [
                (len(args), *kwargs) if kwargs else len(args)
                for args, kwargs in zip(args_col, kwargs_col, strict=True)
            ]
        else:
            shapes = list(map(len, args_col))
        # Any pair of a shape stands for all of them: the last one, from dict().
        bad = {
            shape
            for shape, index in dict(zip(shapes, range(len(shapes)), strict=True)).items()
            if not _fits(cls, args_col[index], kwargs_col[index])
        }
        if not bad:
            return []
        return [index for index, shape in enumerate(shapes) if shape in bad]

    @classmethod
    def dispatch(
        cls,
        *args: Any,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        expires_at: datetime | None = None,
        **kwargs: Any,
    ) -> Job:
        """Enqueue one run of this job; returns the new :class:`~django_gator.models.Job`
        (``expires_at``: not started by then, it never runs)."""
        # Here, not at the top: dispatch imports the models, which `import django_gator`
        # must not (see the module's docstring). Not an import cycle.
        from django_gator.dispatch import enqueue

        return enqueue(
            cls,
            [(args, kwargs)],
            wait=wait,
            at=at,
            queue=queue,
            priority=priority,
            on_commit=on_commit,
            expires_at=expires_at,
        )[0]

    @classmethod
    def dispatch_many(
        cls,
        arguments: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        expires_at: datetime | None = None,
    ) -> list[Job]:
        """Enqueue one run per item in a single INSERT; returns the new rows in order.

        Each item is a list of positional arguments, or a dict of keyword arguments.
        """
        from django_gator.dispatch import enqueue  # not at the top: see dispatch() above

        return enqueue(
            cls,
            dispatch_items(arguments),
            wait=wait,
            at=at,
            queue=queue,
            priority=priority,
            on_commit=on_commit,
            expires_at=expires_at,
            many=True,
        )

    @classmethod
    async def adispatch(
        cls,
        *args: Any,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        expires_at: datetime | None = None,
        **kwargs: Any,
    ) -> Job:
        """:meth:`dispatch` for async code (``await MyJob.adispatch(...)`` in an async
        view): validated on the event loop, inserted in the thread of the caller's
        transaction (see :func:`django_gator.dispatch.aenqueue`)."""
        from django_gator.dispatch import aenqueue  # not at the top: see dispatch() above

        options: dict[str, Any] = {"wait": wait, "at": at, "queue": queue, "priority": priority}
        options["expires_at"] = expires_at
        return (await aenqueue(cls, [(args, kwargs)], on_commit=on_commit, **options))[0]

    @classmethod
    async def adispatch_many(
        cls,
        arguments: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        wait: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        on_commit: bool | str | None = None,
        expires_at: datetime | None = None,
    ) -> list[Job]:
        """:meth:`dispatch_many` for async code."""
        from django_gator.dispatch import aenqueue  # not at the top: see dispatch() above

        options: dict[str, Any] = {"wait": wait, "at": at, "queue": queue, "priority": priority}
        options["expires_at"] = expires_at
        return await aenqueue(
            cls, dispatch_items(arguments), on_commit=on_commit, many=True, **options
        )


def effective_timeout(job_class: type[Queueable]) -> float | None:
    """Seconds a run of ``job_class`` may take: its own ``timeout`` if it sets one (any
    value, shorter or longer than the setting), else ``GATOR_DEFAULT_TIMEOUT``; None for
    no limit. The worker's watchdog, the event loop and the timeout's error message all
    read it here, at each run, so a changed setting applies to the next run."""
    own = job_class.timeout
    return own if own is not None else conf.default_timeout()


def _fits(job_class: type[Queueable], args: list[Any], kwargs: dict[str, Any]) -> bool:
    try:
        job_class.check_arguments(args, kwargs)
    except TypeError:
        return False
    return True
