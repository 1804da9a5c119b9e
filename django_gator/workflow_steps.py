"""A workflow's steps as they are built (:class:`Step`), their names, and the check for a
cycle; :mod:`django_gator.workflows` builds and dispatches the graph."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_gator import validation

if TYPE_CHECKING:
    from django_gator.models import Batch, Job
    from django_gator.queueable import Queueable
    from django_gator.workflows import Workflow

#: Longest step name (the column of WorkflowStep.label).
STEP_NAME_MAX_LENGTH = 100


class Step:
    """One step of a :class:`Workflow`, as :meth:`Workflow.add` returns it; pass it in
    another step's ``after``."""

    __slots__ = (
        "after",
        "args",
        "batch",
        "delay",
        "due_at",
        "job",
        "job_class",
        "kwargs",
        "members",
        "name",
        "on_dead",
        "position",
        "queue",
        "wait_for",
        "workflow",
    )

    def __init__(
        self,
        workflow: Workflow,
        position: int,
        job_class: type[Queueable],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        after: list[Any],
        on_dead: str,
        members: list[tuple[Sequence[Any], Mapping[str, Any]]] | None = None,
        name: str | None = None,
    ) -> None:
        self.workflow = workflow
        self.position = position
        #: Its name in the workflow: given to add(), or its position.
        self.name = str(position) if name is None else name
        #: A sleep, or a wait with a timeout: seconds from its release to its job's run.
        self.delay: float | None = None
        #: A sleep until a moment: when its job runs.
        self.due_at: datetime | None = None
        #: A wait: the signal it waits for ("" for other steps).
        self.wait_for = ""
        #: The queue of its job, when not its job class's (sleeps and waits).
        self.queue: str | None = None
        self.job_class = job_class
        self.args = args
        self.kwargs = kwargs
        self.after = after
        self.on_dead = on_dead
        #: A batch step's members, (args, kwargs) each; None for a step of one job.
        self.members = members
        #: Its Job row once dispatched, for a step that waits for nothing (None otherwise).
        self.job: Job | None = None
        #: Its Batch row once dispatched, for a batch step that waits for nothing.
        self.batch: Batch | None = None

    def depends_on(self, *steps: Step | str) -> Step:
        """Add dependencies after the fact (steps, or names of steps added already;
        checked, like ``after``, at dispatch)."""
        self.after.extend(self.workflow._resolve(steps))
        return self

    def __repr__(self) -> str:
        return f"<step {self.position} ({self.job_class.name})>"

    def label(self) -> str:
        named = "" if self.name == str(self.position) else f" {self.name!r}"
        return f"step {self.position}{named} ({self.job_class.name})"

    @property
    def is_batch(self) -> bool:
        return self.members is not None


def check_step_name(workflow: Workflow, name: str | None) -> str | None:
    """A step name that is new in this workflow; the error names the value."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or len(name) > STEP_NAME_MAX_LENGTH:
        raise ValueError(
            f"a step's name is a non-empty str of at most {STEP_NAME_MAX_LENGTH} "
            f"characters, got {validation.short_repr(name)}"
        )
    if name.isdigit():
        raise ValueError(
            f"a step's name cannot be all digits ({name!r}): those are the positions that "
            "name the steps added without one"
        )
    if any(step.name == name for step in workflow.steps):
        raise ValueError(f"{workflow!r} has a step named {name!r} already")
    return name


def find_cycle(steps: Sequence[Step]) -> list[Step]:
    """A cycle among ``steps`` (first step repeated at the end), or [] if there is none.
    Iterative depth-first search, so a long chain does not hit the recursion limit."""
    white, grey, black = 0, 1, 2
    color = [white] * len(steps)
    for start in steps:
        if color[start.position] != white:
            continue
        path: list[Step] = [start]
        todo: list[Iterator[Step]] = [iter(start.after)]
        color[start.position] = grey
        while todo:
            dependency = next(todo[-1], None)
            if dependency is None:
                color[path[-1].position] = black
                path.pop()
                todo.pop()
                continue
            if color[dependency.position] == grey:
                cycle = [*path[path.index(dependency) :], dependency]
                return cycle[::-1]
            if color[dependency.position] == white:
                color[dependency.position] = grey
                path.append(dependency)
                todo.append(iter(dependency.after))
    return []
