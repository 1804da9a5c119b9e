"""Faults injected into a worker subprocess at its commit boundaries.

``GATOR_TEST_FAULT=<name>`` in a worker's environment makes the test app (its ``ready()``)
wrap the engine's write methods in that process only. Two kinds of fault:

- ``kill_*``: the process SIGKILLs itself at that point, as a power cut would;
- ``lose_*``: the write commits, then the caller gets a database error instead of the
  answer (the connection died after COMMIT): the commit ambiguity every client can meet.

Each fault fires once per process. The package itself has no fault hooks: this module only
wraps public engine methods, in test processes that ask for it.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from django.db import OperationalError

#: name -> what it does, for the tests' parametrization and their ids.
FAULTS = {
    "kill_after_claim": "SIGKILL once a claim has committed, before the job starts",
    "kill_before_success_commit": "SIGKILL after handle() returned, before the success mark",
    "kill_after_success_commit": "SIGKILL right after the success mark committed",
    "kill_before_failure_commit": "SIGKILL after handle() raised, before the failure mark",
    "kill_after_failure_commit": "SIGKILL right after the failure mark committed",
    "lose_claim_answer": "the claim commits; the worker gets an error instead of the rows",
    "lose_success_answer": "the success mark commits; the worker gets an error",
    "lose_failure_answer": "the failure mark commits; the worker gets an error",
}

_fired: set[str] = set()


def _die() -> None:
    sys.stderr.write(f"FAULT {os.environ.get('GATOR_TEST_FAULT')}: SIGKILL pid={os.getpid()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _lose(fault: str) -> None:
    sys.stderr.write(f"FAULT {fault}: answer lost pid={os.getpid()}\n")
    sys.stderr.flush()
    raise OperationalError(f"injected fault {fault}: connection lost after COMMIT")


def _once(fault: str) -> bool:
    if fault in _fired:
        return False
    _fired.add(fault)
    return True


def install(fault: str) -> None:
    """Wrap the engine methods of this process for ``fault`` (one of FAULTS)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown GATOR_TEST_FAULT {fault!r}; known: {', '.join(FAULTS)}")
    from django_gator.engines.base import Engine

    for module in ("postgresql", "mysql", "sqlite"):
        importlib.import_module(f"django_gator.engines.{module}")

    def classes(cls: type) -> list[type]:
        return [cls] + [c for sub in cls.__subclasses__() for c in classes(sub)]

    def wrap(name: str, around: Callable[..., Any]) -> None:
        # Engine (whatever base it inherits the method from), and every engine class that
        # defines its own version (PostgreSQL's claim_and_mark), which must meet the fault
        # too.
        for cls in classes(Engine):
            if cls is not Engine and name not in vars(cls):
                continue
            original = getattr(Engine, name) if cls is Engine else vars(cls)[name]

            @functools.wraps(original)
            def wrapper(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                return around(_original, self, *args, **kwargs)

            setattr(cls, name, wrapper)

    def marks_in(name: str, args: tuple[Any, ...]) -> bool:
        # claim_and_mark(worker, queue, limit, succeeded) / mark_succeeded(worker, done) /
        # mark_succeeded_and_insert(worker, done, rows): is a success being written?
        if name == "claim_and_mark":
            return bool(args[3])
        return bool(args[1])

    def success_write(name: str) -> None:
        def around(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
            writing = marks_in(name, args)
            if writing and fault == "kill_before_success_commit" and _once(fault):
                _die()
            result = original(self, *args, **kwargs)
            # Inside with_steps() (a workflow step's batched mark) nothing has committed
            # yet: the after-commit faults fire when with_steps() returns (workflow_write).
            committed = writing and not self.connection.in_atomic_block
            if committed and fault == "kill_after_success_commit" and _once(fault):
                _die()
            if committed and fault == "lose_success_answer" and _once(fault):
                _lose(fault)
            if name == "claim_and_mark" and result[0]:
                if fault == "kill_after_claim" and _once(fault):
                    _die()
                if fault == "lose_claim_answer" and _once(fault):
                    _lose(fault)
            return result

        wrap(name, around)

    for name in ("claim_and_mark", "mark_succeeded"):
        success_write(name)

    def chain_or_atomic_success(
        original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if fault == "kill_before_success_commit" and _once(fault):
            _die()
        result = original(self, *args, **kwargs)
        from django.db import connections

        from django_gator import conf

        inside = connections[conf.database()].in_atomic_block
        if fault == "kill_after_success_commit" and not inside and _once(fault):
            _die()
        if fault == "lose_success_answer" and not inside and _once(fault):
            _lose(fault)
        return result

    wrap("mark_succeeded_and_insert", chain_or_atomic_success)

    def failure_write(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        if fault == "kill_before_failure_commit" and _once(fault):
            _die()
        result = original(self, *args, **kwargs)
        if fault == "kill_after_failure_commit" and _once(fault):
            _die()
        if fault == "lose_failure_answer" and _once(fault):
            _lose(fault)
        return result

    wrap("mark_failed_and_insert", failure_write)

    def workflow_write(
        original: Callable[..., Any], self: Any, job_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        # A workflow step's outcome commits with the release of what follows it, when
        # with_steps() returns: the "after commit" faults fire there for steps.
        result = original(self, job_ids, *args, **kwargs)
        if job_ids and result:
            if fault.startswith("kill_after_") and _once(fault):
                _die()
            if fault.startswith("lose_") and fault != "lose_claim_answer" and _once(fault):
                _lose(fault)
        return result

    wrap("with_steps", workflow_write)

    if fault == "kill_after_success_commit":
        # An atomic job's mark commits with its transaction, after the engine call
        # returned: job_finished is sent once that transaction has committed.
        from django_gator import signals

        def after_atomic_commit(sender: Any, state: str, **kwargs: Any) -> None:
            if getattr(sender, "atomic", False) and state == "succeeded" and _once(fault):
                _die()

        signals.job_finished.connect(after_atomic_commit, weak=False)


def install_from_env() -> None:
    fault = os.environ.get("GATOR_TEST_FAULT")
    if fault:
        install(fault)
