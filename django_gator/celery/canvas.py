"""Celery's canvas on django-gator's workflows: a :class:`Signature` (``task.s()``,
``task.si()``), :func:`chain`, :func:`group` and :func:`chord`.

Each canvas is dispatched as one :class:`~django_gator.workflows.Workflow`: a chain's
tasks are steps in a line, a group is a batch step (one task) or parallel steps (several
tasks), a chord is a group followed by its callback. As in Celery, a step of a
``s()`` signature receives the result of what comes before it as its first argument (a
group's: the list of its results, in order); a ``si()`` signature receives nothing. The
job fills that argument in when it runs, from ``self.results()``: the placeholder shows
in the admin until then. Its AsyncResult's id is the workflow's; ``get()`` returns the
last task's result (a group's: the list of its results)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_gator.celery import options as opts
from django_gator.celery.exceptions import NotSupported
from django_gator.celery.task import PARENT_RESULT, BaseTask
from django_gator.validation import validate_queue
from django_gator.workflows import Step, Workflow

if TYPE_CHECKING:
    from django_gator.celery.app import Celery
    from django_gator.celery.results import AsyncResult

#: apply_async() options of a canvas (expires= is a single task's).
CANVAS_OPTIONS = "args, kwargs, countdown, eta, queue, priority"


class Task(BaseTask):
    """A Celery task (see :class:`~django_gator.celery.task.BaseTask`) with its
    signatures: ``s()``, ``si()``, ``signature()``."""

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        return self.signature(args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        return self.signature(args, kwargs, immutable=True)

    def signature(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        immutable: bool = False,
        **options: Any,
    ) -> Signature:
        return Signature(self, args, kwargs, immutable=immutable, **options)

    subtask = signature


class Signature:
    """A task with (some of) its arguments: ``task.s(2)``, ``task.si(2)``."""

    def __init__(
        self,
        task: Task,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        immutable: bool = False,
        **options: Any,
    ) -> None:
        self.task = task
        self.args = tuple(args or ())
        self.kwargs = dict(kwargs or {})
        self.immutable = immutable
        self.options: dict[str, Any] = {}
        self.set(**options)

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}({', '.join(shown)}){'!' if self.immutable else ''}"

    def set(self, **options: Any) -> Signature:
        """Options of this task in a canvas: ``queue`` only."""
        for key, value in options.items():
            if key != "queue":
                raise opts.refuse(
                    f"{self.task.name} signature", key, value, "a signature may set queue= only"
                )
            validate_queue(value)
        self.options.update(options)
        return self

    def clone(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Signature:
        """A copy with ``args`` put before its own (as Celery merges partial arguments)."""
        return Signature(
            self.task,
            (*args, *self.args),
            {**self.kwargs, **(kwargs or {})},
            self.immutable,
            **self.options,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        merged = self.clone(args, kwargs)
        return self.task(*merged.args, **merged.kwargs)

    def __or__(self, other: Any) -> Canvas:
        return chain(self, other)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        merged = self.clone(args or (), kwargs)
        options.setdefault("queue", self.options.get("queue"))
        return self.task.apply_async(merged.args, merged.kwargs, **options)


class Canvas:
    """A chain (its items in a line), a group (its items in parallel) or a chord."""

    def __init__(self, kind: str, items: list[Signature | Canvas]) -> None:
        self.kind = kind
        self.items = items
        for item in items:
            if not isinstance(item, Signature | Canvas):
                raise TypeError(f"{kind}() takes signatures (task.s(...)), got {item!r}")
            if kind == "group" and not isinstance(item, Signature):
                raise NotSupported(
                    f"group() of {item!r} is not supported: a group's members are "
                    "signatures (task.s(...)); use a django_gator Workflow for other shapes"
                )
        if kind == "chain":
            self.items = _flatten(items)

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(map(repr, self.items))})"

    def __or__(self, other: Any) -> Canvas:
        return chain(self, other)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Dispatch the canvas as one workflow; ``args``/``kwargs`` go to its first task(s)."""
        for key, value in options.items():
            why = opts.CALL_REFUSED.get(key, f"a canvas maps {CANVAS_OPTIONS}")
            raise opts.refuse(f"{self.kind}.apply_async()", key, value, why)
        workflow = Workflow(repr(self)[:200])
        line = [self] if self.kind == "group" else self.items
        first = True
        previous: list[Step] = []
        for position, item in enumerate(line):
            extra = (args or (), kwargs) if first else ((), None)
            previous = _add(workflow, position, item, previous, extra)
            first = False
        app = _app(self)
        run = workflow.dispatch(
            wait=countdown,
            at=eta,
            queue=queue,
            priority=priority,
            on_commit=False if app.eager_now else None,
        )
        from django_gator.celery.results import AsyncResult
        from django_gator.models import Job  # imports the models: not at import time

        roots = Job.objects.using(run._alias()).filter(chain_id=run.pk).order_by("pk")
        ids = list(roots.values_list("pk", flat=True)) if app.eager_now else []
        return app.finish_dispatch(ids, AsyncResult(str(run.pk)), run._alias())

    def __call__(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)


def _flatten(items: list[Signature | Canvas]) -> list[Signature | Canvas]:
    flat: list[Signature | Canvas] = []
    for item in items:
        if isinstance(item, Canvas) and item.kind == "chain":
            flat += item.items
        elif isinstance(item, Canvas) and item.kind == "chord":
            flat += item.items  # a chord is its group, then its callback
        else:
            flat.append(item)
    return flat


def _app(canvas: Canvas) -> Celery:
    for item in canvas.items:
        if isinstance(item, Signature):
            return item.task.app
        return _app(item)
    raise ValueError(f"{canvas.kind}() has no task")


def _add(
    workflow: Workflow,
    position: int,
    item: Signature | Canvas,
    previous: list[Step],
    extra: tuple[Sequence[Any], dict[str, Any] | None],
) -> list[Step]:
    """Add ``item`` after ``previous``; returns the steps the next item comes after."""
    if isinstance(item, Signature):
        return [_add_one(workflow, None, item.clone(*extra), previous)]
    members = [sig.clone(*extra) for sig in item.items if isinstance(sig, Signature)]
    if not members:
        raise ValueError("group() has no task")
    if all(_batchable(members[0], sig) for sig in members):
        sig = members[0]
        step = workflow.add_batch(
            sig.task.job_class,
            [_args(member, previous) for member in members],
            after=previous,
            name=f"g{position}",
        )
        step.queue = _queue(sig)
        return [step]
    return [
        _add_one(workflow, f"g{position}.{index}", sig, previous)
        for index, sig in enumerate(members)
    ]


def _batchable(first: Signature, sig: Signature) -> bool:
    return (
        not sig.kwargs
        and sig.task is first.task
        and sig.immutable == first.immutable
        and sig.options.get("queue") == first.options.get("queue")
    )


def _args(sig: Signature, previous: list[Step]) -> list[Any]:
    if previous and not sig.immutable:
        return [PARENT_RESULT, *sig.args]
    return list(sig.args)


def _queue(sig: Signature) -> str | None:
    task = sig.task
    if task.priority is None and task.app.route_priority(task, None) is not None:
        raise NotSupported(
            f"{task.name}: a routed or default priority is not supported in a canvas (its "
            "steps take the task's own priority=); set priority= on the task"
        )
    return task.app.route_queue(task, sig.options.get("queue"))


def _add_one(workflow: Workflow, name: str | None, sig: Signature, previous: list[Step]) -> Step:
    step = workflow.add_step(
        sig.task.job_class, _args(sig, previous), sig.kwargs, after=previous, name=name
    )
    step.queue = _queue(sig)
    return step


def _items(tasks: tuple[Any, ...]) -> list[Any]:
    if len(tasks) == 1 and isinstance(tasks[0], Iterable) and not isinstance(tasks[0], Canvas):
        return list(tasks[0])
    return list(tasks)


def chain(*tasks: Any, **options: Any) -> Canvas:
    """``chain(a.s(1), b.s(), c.si(3))``: each after the previous one succeeded."""
    if options:
        raise opts.refuse("chain()", next(iter(options)), options, "pass options to apply_async()")
    return Canvas("chain", _items(tasks))


def group(*tasks: Any, **options: Any) -> Canvas:
    """``group(a.s(i) for i in ids)``: in parallel; its result is the list of theirs."""
    if options:
        raise opts.refuse("group()", next(iter(options)), options, "pass options to apply_async()")
    return Canvas("group", _items(tasks))


class chord(Canvas):
    """``chord(group(...), callback.s())``: the callback runs once every task of the group
    succeeded, with the list of their results."""

    def __init__(self, header: Any, body: Signature | None = None, **options: Any) -> None:
        if options:
            raise opts.refuse("chord()", next(iter(options)), options, "use apply_async()")
        self.header = header if isinstance(header, Canvas) else group(header)
        if self.header.kind != "group":
            raise NotSupported(f"chord({self.header!r}): a chord's header is a group")
        self.body = body
        super().__init__("chord", [self.header] if body is None else [self.header, body])

    def __call__(self, body: Any = None, *args: Any, **kwargs: Any) -> AsyncResult:
        """``chord(header)(callback)``: dispatch with this callback."""
        if isinstance(body, Signature):
            return chord(self.header, body).apply_async(args, kwargs)
        return self.apply_async((body, *args) if body is not None else args, kwargs)
