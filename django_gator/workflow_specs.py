"""A workflow's steps as dispatch inserts them: checked, their arguments serialized as
JSON, their concurrency keys computed (:func:`step_specs`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from django_gator import conf, encryption, limits
from django_gator.payload import encode_payload

if TYPE_CHECKING:
    from django_gator.queueable import Queueable
    from django_gator.workflows import Step


def step_specs(steps: Sequence[Step], queue: str | None, priority: int | None) -> list[StepSpec]:
    """Each step checked and its arguments serialized (no database access); ``queue`` and
    ``priority``, when given, override every step's. An error names the step."""
    specs = []
    for step in steps:
        step_queue = queue if queue is not None else (step.queue or step.job_class.queue)
        try:
            args_json, kwargs_json = _sealed(
                step.job_class, *encode_payload(step.args, step.kwargs)
            )
            keyer = step.job_class(queue=step_queue) if step.job_class.traits.is_keyed else None
            key = (
                None
                if step.is_batch
                else limits.flow_key(step.job_class, keyer, step.args, step.kwargs)
            )
        except (TypeError, ValueError) as exc:
            exc.args = (f"{step.label()}: {exc}", *exc.args[1:])
            raise
        specs.append(
            StepSpec(
                position=step.position,
                label=step.name,
                job_class=step.job_class,
                args_json=args_json,
                kwargs_json=kwargs_json,
                queue=step_queue,
                priority=priority if priority is not None else step.job_class.priority,
                after=sorted({d.position for d in step.after}),
                on_dead=step.on_dead,
                concurrency_key=key,
                members=None if step.members is None else _members(step, keyer),
                wait_for=step.wait_for,
                delay=step.delay,
                due_at=step.due_at,
            )
        )
    return specs


class StepSpec:
    """A checked step, its arguments serialized: what dispatch_workflow inserts."""

    __slots__ = (
        "after",
        "args_json",
        "concurrency_key",
        "delay",
        "due_at",
        "job_class",
        "kwargs_json",
        "label",
        "members",
        "on_dead",
        "position",
        "priority",
        "queue",
        "wait_for",
    )

    def __init__(
        self,
        *,
        position: int,
        label: str,
        job_class: type[Queueable],
        args_json: str,
        kwargs_json: str,
        queue: str,
        priority: int,
        after: list[int],
        on_dead: str,
        concurrency_key: str | None = None,
        members: list[MemberSpec] | None = None,
        wait_for: str = "",
        delay: float | None = None,
        due_at: datetime | None = None,
    ) -> None:
        self.position = position
        #: The step's name (its position, unless named).
        self.label = label
        self.job_class = job_class
        self.args_json = args_json
        self.kwargs_json = kwargs_json
        self.queue = queue
        self.priority = priority
        self.after = after
        self.on_dead = on_dead
        #: For a class with a concurrency or rate limit (see limits.flow_key).
        self.concurrency_key = concurrency_key
        #: A batch step's members, checked and serialized; None for a step of one job.
        self.members = members
        #: A wait: its signal; a sleep or a wait: when its job is due (see WorkflowStep).
        self.wait_for = wait_for
        self.delay = delay
        self.due_at = due_at

    def values(self) -> tuple[Any, Any]:
        return json.loads(self.args_json), json.loads(self.kwargs_json)


class MemberSpec(NamedTuple):
    """One member of a batch step, its arguments checked and serialized."""

    args: list[Any]
    kwargs: dict[str, Any]
    args_json: str
    kwargs_json: str
    concurrency_key: str | None


def _members(step: Step, keyer: Queueable | None) -> list[MemberSpec]:
    """Serialize a batch step's members (the arguments were checked by add_batch())."""
    assert step.members is not None
    out = []
    limit = conf.max_payload_bytes()
    for index, (args, kwargs) in enumerate(step.members):
        try:
            args_json, kwargs_json = encode_payload(args, kwargs, limit)
            key = limits.flow_key(step.job_class, keyer, args, kwargs)
        except (TypeError, ValueError) as exc:
            exc.args = (f"{step.label()}, batch item {index}: {exc}", *exc.args[1:])
            raise
        if step.job_class.traits.encrypted:  # the step's row keeps them: sealed
            args_json, kwargs_json = _sealed(step.job_class, args_json, kwargs_json)
            sealed = MemberSpec(
                json.loads(args_json), json.loads(kwargs_json), args_json, kwargs_json, key
            )
            out.append(sealed)
            continue
        out.append(MemberSpec(list(args), dict(kwargs), args_json, kwargs_json, key))
    return out


def _sealed(job_class: type[Queueable], args_json: str, kwargs_json: str) -> tuple[str, str]:
    """A step's arguments as its rows store them: sealed for an encrypted class."""
    if not job_class.traits.encrypted:
        return args_json, kwargs_json
    listed = job_class.traits.sealed_kwargs
    if listed is not None:  # encrypted = [names]: those keyword arguments only
        return args_json, encryption.seal_fields(kwargs_json, listed)
    return encryption.seal_json(args_json), encryption.seal_json(kwargs_json)
