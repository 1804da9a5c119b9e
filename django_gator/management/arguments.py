"""The kinds of value the ``gator_*`` commands take, each defined once.

An :class:`ArgumentType` turns a command-line string, or the value a caller handed to
``call_command`` (an int for ``--batch-size``, say), into the value the command uses, or
refuses it with a message that names the option and the value. A command uses one in
either of two ways, whichever suits how the option must fail:

* as argparse's ``type=``: refused while the command line is parsed, before ``--help`` or
  anything else runs (``gator_worker``, ``gator_bench``);
* with :meth:`ArgumentType.convert` in ``handle()``: the values given to ``call_command``
  as keywords (which argparse never sees) are checked too, and a refusal is a
  ``CommandError`` with exit code 2 (``gator_prune``, ``gator_retry``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from django.core.management.base import CommandError

from django_gator import conf, schema
from django_gator.databases import job_databases
from django_gator.models import exception_class_name
from django_gator.validation import short_repr, validate_name, validate_queue
from django_gator.worker.queues import QueueSpec, parse_queue_spec

T = TypeVar("T")


class BadValue(ValueError):
    """A refused value. The message reads after the option's name: with ``follows`` as
    ``--batch-size must be at least 1, got 0``, else as ``--batch-size: 'x' is not a whole
    number``."""

    def __init__(self, message: str, *, follows: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.follows = follows

    def for_option(self, option: str) -> str:
        return f"{option} {self.message}" if self.follows else f"{option}: {self.message}"


class ArgumentType(Generic[T]):
    """One kind of option value. Subclasses define :meth:`parse`."""

    def parse(self, value: object) -> T:
        """``value`` (a command-line string or a ``call_command`` value) as the command
        uses it; BadValue if it is refused."""
        raise NotImplementedError

    def __call__(self, text: str) -> T:
        """argparse's ``type=``: a refusal becomes argparse's error for the option."""
        try:
            return self.parse(text)
        except BadValue as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    def convert(self, value: object, option: str) -> T:
        """``value`` of ``option`` in ``handle()``: a refusal is a CommandError with exit
        code 2 naming the option and the value."""
        try:
            return self.parse(value)
        except BadValue as exc:
            raise CommandError(exc.for_option(option), returncode=2) from None

    def convert_all(self, values: Iterable[object], option: str) -> list[T]:
        """Each value of a repeatable option (``action="append"``)."""
        return [self.convert(value, option) for value in values]


class WholeNumber(ArgumentType[int]):
    """An int of at least ``minimum``."""

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def parse(self, value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                raise BadValue(f"{short_repr(value)} is not a whole number") from None
        if number < self.minimum:
            raise BadValue(f"must be at least {self.minimum}, got {number}", follows=True)
        return number


class Seconds(ArgumentType[float]):
    """A finite number of seconds, zero or more."""

    def parse(self, value: object) -> float:
        try:
            if isinstance(value, int | float) and not isinstance(value, bool):
                number = float(value)
            else:
                number = float(str(value).strip())
        except (ValueError, OverflowError):
            raise BadValue(f"{short_repr(value)} is not a finite number of seconds") from None
        if not 0 <= number < math.inf:
            raise BadValue(
                f"must be a finite number of seconds, zero or more, got {short_repr(value)}",
                follows=True,
            )
        return number


class Choice(ArgumentType[str]):
    """One of ``choices``; ``why`` says what the others are left out for."""

    def __init__(self, choices: Iterable[str], why: str = "") -> None:
        self.choices = tuple(choices)
        self.why = why

    def parse(self, value: object) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        why = f" ({self.why})" if self.why else ""
        raise BadValue(
            f"{short_repr(value)} is not one of {', '.join(self.choices)}{why}", follows=True
        )


class Checked(ArgumentType[T]):
    """A value ``check`` accepts (and returns), refused with the check's own ValueError
    message: a queue name, a job name, an exception class name."""

    def __init__(self, check: Callable[[str], T], *, follows: bool = False) -> None:
        self.check = check
        self.follows = follows

    def parse(self, value: object) -> T:
        try:
            if not isinstance(value, str):
                raise ValueError(f"must be a str, got {short_repr(value)}")
            return self.check(value)
        except ValueError as exc:
            raise BadValue(str(exc), follows=self.follows) from None


def _queue_name(text: str) -> str:
    validate_queue(text)
    return text


def _job_name(text: str) -> str:
    validate_name(text)
    return text


def _queue_spec(text: str) -> QueueSpec:
    name = text.partition(",")[0].strip()
    if name:
        validate_queue(name)  # dispatch's own check first: it lists the characters allowed
    return parse_queue_spec(text)


#: ``NAME``: a queue name as dispatch accepts it.
QUEUE_NAME = Checked(_queue_name)
#: ``NAME``: a registered job's name as dispatch accepts it.
JOB_NAME = Checked(_job_name)
#: ``CLASS``: an exception class as recorded (``myapp.jobs.Boom``) or its last parts.
EXCEPTION_CLASS = Checked(exception_class_name, follows=True)
#: ``NAME[,WEIGHT]``: a queue a worker works on, with its weight.
QUEUE_SPEC = Checked(_queue_spec)


def _job_database(text: str) -> str:
    known = job_databases()
    if text not in known:
        raise ValueError(
            f"{text!r} is not a job database (GATOR_DATABASE or an alias of "
            f"GATOR_QUEUE_DATABASES: {', '.join(map(repr, known))})"
        )
    return text


#: ``ALIAS``: a job database: GATOR_DATABASE or an alias GATOR_QUEUE_DATABASES names.
JOB_DATABASE = Checked(_job_database)


def add_database_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--database ALIAS``: the job database the command ``what`` (default GATOR_DATABASE)."""
    parser.add_argument(
        "--database",
        default=None,
        metavar="ALIAS",
        help=f"The job database whose jobs it {what} (an alias GATOR_QUEUE_DATABASES "
        "routes queues to; default GATOR_DATABASE).",
    )


def chosen_database(options: dict[str, object]) -> str:
    """The job database ``--database`` names (checked), or GATOR_DATABASE; refused with
    the one-line "run migrate" when it lacks django-gator's tables (see require_tables)."""
    value = options.get("database")
    alias = conf.database() if value is None else JOB_DATABASE.convert(value, "--database")
    require_tables(alias)
    return alias


def require_tables(alias: str) -> None:
    """A CommandError saying to run ``manage.py migrate`` (for ``alias``) when database
    ``alias`` lacks django-gator's tables: a command's whole output then, not the
    traceback of a "no such table" in its first query."""
    missing = schema.missing_tables(alias)
    if missing:
        raise CommandError(schema.missing_tables_message(alias, missing))


class SettingValue(ArgumentType[float]):
    """A value standing in for the numeric setting ``setting`` (an int or a float, as
    ``kind`` says): it must be in the range the system check (E003) allows for it."""

    def __init__(self, setting: str, kind: type[int] | type[float]) -> None:
        self.setting = setting
        self.kind = kind

    def parse(self, value: object) -> float:
        text = str(value)
        try:
            number = self.kind(text)
        except ValueError:
            what = "a whole number" if self.kind is int else "a number"
            raise BadValue(f"{text!r} is not {what}") from None
        problem = conf.range_error(self.setting, number, given=text)
        if problem is not None:
            raise BadValue(f"{problem} (the range of {self.setting})", follows=True)
        return number
