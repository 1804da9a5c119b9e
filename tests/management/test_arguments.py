"""The option types every ``gator_*`` command parses its values with
(:mod:`django_gator.management.arguments`): a bad value is refused naming the option and
the value, from the command line and from ``call_command`` alike."""

from __future__ import annotations

import argparse
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_gator.management.arguments import (
    EXCEPTION_CLASS,
    JOB_NAME,
    QUEUE_NAME,
    QUEUE_SPEC,
    Choice,
    Seconds,
    SettingValue,
    WholeNumber,
)
from django_gator.worker.queues import QueueSpec


def refusal(kind: object, value: object, option: str) -> CommandError:
    with pytest.raises(CommandError) as caught:
        kind.convert(value, option)  # type: ignore[attr-defined]
    assert caught.value.returncode == 2
    return caught.value


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        (WholeNumber(), "many", "--x: 'many' is not a whole number"),
        (WholeNumber(), "0", "--x must be at least 1, got 0"),
        (WholeNumber(minimum=5), 4, "--x must be at least 5, got 4"),
        (WholeNumber(), True, "--x: True is not a whole number"),
        (WholeNumber(), 2.5, "--x: 2.5 is not a whole number"),
        (Seconds(), "soon", "--x: 'soon' is not a finite number of seconds"),
        (Seconds(), "-1", "--x must be a finite number of seconds, zero or more, got '-1'"),
        (Seconds(), float("nan"), "zero or more, got nan"),
        (Choice(["a", "b"], why="c is never"), "c", "--x 'c' is not one of a, b (c is never)"),
        (QUEUE_NAME, "bad queue", "--x: invalid queue name 'bad queue'"),
        (QUEUE_NAME, 5, "--x: must be a str, got 5"),
        (JOB_NAME, "", "--x: job name must be a non-empty str"),
        (EXCEPTION_CLASS, "a b", "--x 'a b' is not an exception class name"),
    ],
)
def test_a_refused_value_is_named_with_its_option(kind, value, message):
    assert message in str(refusal(kind, value, "--x"))


def test_a_long_value_is_shortened_in_the_message():
    message = str(refusal(EXCEPTION_CLASS, "no " * 100, "--error"))

    assert message.startswith("--error 'no no no")
    assert "..." in message
    assert len(message) < 200


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        (WholeNumber(), " 12 ", 12),
        (WholeNumber(), 3, 3),  # call_command passes ints as they are
        (Seconds(), "0", 0.0),
        (Seconds(), 1.5, 1.5),
        (Seconds(), "1e300", 1e300),
        (Choice(["a", "b"]), "b", "b"),
        (QUEUE_NAME, "emails", "emails"),
        (EXCEPTION_CLASS, "myapp.jobs.Boom", "myapp.jobs.Boom"),
        (QUEUE_SPEC, "emails,3", QueueSpec("emails", 3)),
    ],
)
def test_an_accepted_value_is_converted(kind, value, expected):
    assert kind.convert(value, "--x") == expected
    if isinstance(value, str):
        assert kind(value) == expected  # as argparse's type=


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (WholeNumber(), "0", "must be at least 1, got 0"),
        (WholeNumber(), "x", "'x' is not a whole number"),
        (QUEUE_SPEC, "bad queue", "invalid queue name 'bad queue'"),
        (QUEUE_SPEC, "emails,0", "queue weight 0 in 'emails,0' must be from 1 to"),
        (SettingValue("GATOR_CONCURRENCY", int), "two", "'two' is not a whole number"),
        (SettingValue("GATOR_POLL_INTERVAL", float), "x", "'x' is not a number"),
        (SettingValue("GATOR_CONCURRENCY", int), "0", "got 0 (the range of GATOR_CONCURRENCY)"),
    ],
)
def test_as_argparse_type_a_refusal_is_argparses_error(kind, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        kind(text)

    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drain", "lots"], "argument --drain: 'lots' is not a whole number"),
        (["--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
    ],
)
def test_gator_bench_refuses_a_bad_count_naming_it(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("gator_bench", *args, stdout=StringIO())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-q", "bad queue"], "argument -q/--queue: invalid queue name 'bad queue'"),
        (["-q", "a,x"], "queue weight 'x' in 'a,x' is not a whole number"),
        (["-c", "many"], "argument -c/--concurrency: 'many' is not a whole number"),
    ],
)
def test_gator_worker_refuses_a_bad_option_before_it_starts(args, message):
    # "--help" after the bad value: an accepted one would print the help and exit instead.
    with pytest.raises(CommandError, match=message):
        call_command("gator_worker", *args, "--help")
