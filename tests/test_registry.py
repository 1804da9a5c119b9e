"""The registry: the only way a job name becomes code. Definition-time checks, name clashes,
unknown and tampered names (never imported)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_gator import GatorError, JobNotRegistered, Queueable, Retry, get_job_class, job
from django_gator.exceptions import AlreadyRegistered
from django_gator.jobfunction import FunctionJob, resolve_job_class
from django_gator.models import Job, JobState
from django_gator.queueable import register, registered_jobs, unregister
from django_gator.traits import JobTraits
from tests.conftest import run_worker
from tests.factories import JobFactory
from tests.testapp.jobs import Echo, add, async_record, record_kw, refresh_feed


@pytest.fixture(autouse=True)
def restore_registry() -> Iterator[None]:
    """Classes defined by a test leave the registry as they found it."""
    before = registered_jobs()
    yield
    for name, cls in registered_jobs().items():
        if name not in before:
            unregister(name)
        elif before[name] is not cls:
            unregister(name)
            register(before[name])


# -- lookups -------------------------------------------------------------------------------


def test_autodiscovered_jobs_are_registered_under_their_names():
    jobs = registered_jobs()

    assert jobs["tests.testapp.jobs.Echo"] is Echo
    assert get_job_class("tests.testapp.jobs.Echo") is Echo
    assert get_job_class("tests.testapp.jobs.add") is add.job_class
    assert get_job_class("tests.testapp.jobs.record_kw") is record_kw.job_class
    assert issubclass(add.job_class, FunctionJob)
    # Abstract bases are not jobs.
    assert "django_gator.jobfunction.FunctionJob" not in jobs
    assert "django_gator.queueable.Queueable" not in jobs


def test_an_unknown_name_is_refused_naming_it_and_its_close_matches():
    with pytest.raises(JobNotRegistered) as excinfo:
        get_job_class("tests.testapp.jobs.Ecko")

    exc = excinfo.value
    assert isinstance(exc, LookupError)
    assert isinstance(exc, GatorError)
    assert exc.name == "tests.testapp.jobs.Ecko"
    assert "tests.testapp.jobs.Echo" in exc.suggestions
    assert str(exc).startswith(
        "job name 'tests.testapp.jobs.Ecko' is not registered; did you mean "
        "'tests.testapp.jobs.Echo'"
    )


def test_an_unknown_name_with_nothing_close_gets_no_suggestions():
    with pytest.raises(JobNotRegistered) as excinfo:
        get_job_class("zzzz")

    assert excinfo.value.suggestions == []
    assert str(excinfo.value) == "job name 'zzzz' is not registered"


def test_an_unregistered_job_is_no_longer_found():
    class Temporary(Queueable):
        name = "tests.test_registry.temporary"

        def handle(self) -> None:
            return None

    assert get_job_class("tests.test_registry.temporary") is Temporary
    unregister("tests.test_registry.temporary")
    with pytest.raises(JobNotRegistered, match=r"'tests\.test_registry\.temporary'"):
        get_job_class("tests.test_registry.temporary")


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "subprocess.run",
        "builtins.eval",
        "django_gator.jobfunction.FunctionJob",  # a real Queueable subclass, but abstract
        "tests.testapp.jobs",  # the module that holds the jobs
        "",
        "tests.testapp.jobs.Echo\n",
        " tests.testapp.jobs.Echo",
        "a\nINFO forged log line",
        "x" * 10_000,
    ],
    ids=[
        "os.system",
        "subprocess",
        "eval",
        "abstract",
        "module",
        "empty",
        "newline-suffix",
        "space-prefix",
        "log-injection",
        "10kB",
    ],
)
def test_tampered_names_are_refused_with_the_name_escaped(name):
    with pytest.raises(JobNotRegistered) as excinfo:
        get_job_class(name)

    message = str(excinfo.value)
    assert message.startswith(f"job name {name!r} is not registered")
    assert "\n" not in message
    if len(name) > 1000:
        assert excinfo.value.suggestions == []


@pytest.mark.parametrize("name", [None, 42, ("a", "b"), ["unhashable"], b"tests.testapp.jobs.Echo"])
def test_non_string_names_are_refused_not_crashed_on(name):
    with pytest.raises(JobNotRegistered) as excinfo:
        get_job_class(name)

    assert repr(name) in str(excinfo.value)


def _prove_importable(name: str, marker: Path) -> None:
    # The trap works: importing the module does leave the marker (so the checks above can fail).
    importlib.import_module(name)
    assert marker.read_text() == "imported"


def test_looking_up_a_dotted_path_never_imports_it(booby_trapped_module):
    module, marker = booby_trapped_module

    for name in (f"{module}.Job", module, f"{module}:Job"):
        with pytest.raises(JobNotRegistered):
            get_job_class(name)

    assert module not in sys.modules
    assert not marker.exists()
    _prove_importable(module, marker)


@pytest.mark.django_db(transaction=True)
def test_a_worker_sends_a_tampered_row_to_dead_without_importing_it(booby_trapped_module):
    module, marker = booby_trapped_module
    tampered = JobFactory(name=f"{module}.Job", args=["rm -rf /"])
    fine = JobFactory(name=Echo.name, queue=Echo.queue, args=["fine"])

    run_worker()

    tampered.refresh_from_db()
    assert tampered.state == JobState.DEAD
    assert f"job name '{module}.Job' is not registered" in tampered.last_error
    assert Job.objects.get(pk=fine.pk).state == JobState.SUCCEEDED
    assert module not in sys.modules
    assert not marker.exists()
    _prove_importable(module, marker)


def test_resolve_job_class_accepts_job_classes_and_job_functions_only():
    assert resolve_job_class(Echo) is Echo
    assert resolve_job_class(add) is add.job_class
    for bad in (Queueable, FunctionJob, "tests.testapp.jobs.Echo", add.func, object):
        with pytest.raises(TypeError, match="expected a Queueable subclass or a @job function"):
            resolve_job_class(bad)


# -- definitions: checked when the class statement runs -------------------------------------


@pytest.mark.django_db
def test_two_classes_cannot_share_a_name():
    class First(Queueable):
        name = "tests.test_registry.shared"

        def handle(self) -> None:
            return None

    with pytest.raises(AlreadyRegistered) as excinfo:

        class Second(Queueable):
            name = "tests.test_registry.shared"

            def handle(self) -> None:
                return None

    message = str(excinfo.value)
    assert "'tests.test_registry.shared' is already registered" in message
    assert "test_two_classes_cannot_share_a_name.<locals>.First" in message
    assert get_job_class("tests.test_registry.shared") is First

    with pytest.raises(AlreadyRegistered, match=r"'tests\.test_registry\.shared'"):

        @job(name="tests.test_registry.shared")
        def third() -> None:
            return None

    assert get_job_class("tests.test_registry.shared") is First
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_an_explicit_name_cannot_take_over_an_autodiscovered_job():
    with pytest.raises(AlreadyRegistered, match=r"tests\.testapp\.jobs\.Echo"):

        class Impostor(Queueable):
            name = "tests.testapp.jobs.Echo"

            def handle(self) -> None:
                return None

    assert get_job_class("tests.testapp.jobs.Echo") is Echo
    assert not Job.objects.exists()


def test_the_same_class_statement_run_again_replaces_its_registration():
    def define() -> type[Queueable]:
        class Reloaded(Queueable):
            name = "tests.test_registry.reloaded"

            def handle(self) -> None:
                return None

        return Reloaded

    first, second = define(), define()

    assert first is not second
    assert get_job_class("tests.test_registry.reloaded") is second


def test_subclasses_get_their_own_names_and_abstract_bases_none():
    class Base(Queueable, abstract=True):
        queue = "base-queue"

        def handle(self, x: int) -> None:
            return None

    class Concrete(Base):
        pass

    class Child(Concrete):
        priority = 9

    assert not hasattr(Base, "name")
    assert Concrete.name.endswith("<locals>.Concrete")
    assert Child.name.endswith("<locals>.Child")
    assert get_job_class(Concrete.name) is Concrete
    assert get_job_class(Child.name) is Child
    assert (Child.queue, Child.priority) == ("base-queue", 9)


@pytest.mark.django_db
def test_dispatching_an_abstract_class_is_a_clear_type_error():
    class AbstractBase(Queueable, abstract=True):
        def handle(self) -> None:
            return None

    for target in (Queueable, AbstractBase):
        with pytest.raises(TypeError, match=r"abstract|not a registered job"):
            target.dispatch()
    assert not Job.objects.exists()


def _define_handler(**namespace: Any) -> type[Queueable]:
    return type("BadDefinition", (Queueable,), {"name": "tests.test_registry.bad", **namespace})


def _handle_with(param: str, kind: str) -> Any:
    source = {
        "positional": f"def handle(self, {param}): pass",
        "keyword-only": f"def handle(self, *, {param}=None): pass",
    }[kind]
    scope: dict[str, Any] = {}
    exec(source, scope)
    return scope["handle"]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["positional", "keyword-only"])
@pytest.mark.parametrize("param", ["queue", "wait", "at", "priority", "on_commit"])
def test_handler_parameters_named_like_dispatch_options_are_refused(param, kind):
    before = registered_jobs()

    with pytest.raises(TypeError, match=rf"has the parameter '{param}', which.*rename them"):
        _define_handler(handle=_handle_with(param, kind))

    assert registered_jobs() == before
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_job_functions_with_a_parameter_named_like_an_option_are_refused():
    before = registered_jobs()

    with pytest.raises(TypeError, match="has the parameters 'queue', 'wait', which"):

        @job
        def clashing(wait: int, *, queue: str) -> None:
            return None

    assert registered_jobs() == before
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_positional_only_parameter_named_queue_is_fine():
    class PositionalQueue(Queueable):
        name = "tests.test_registry.positional_queue"

        def handle(self, queue: str, /, **kwargs: Any) -> None:
            return None

    row = PositionalQueue.dispatch("as-an-argument", queue="as-an-option", note=1)

    assert (row.args, row.kwargs, row.queue) == (["as-an-argument"], {"note": 1}, "as-an-option")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("namespace", "error", "pattern"),
    [
        ({}, TypeError, r"BadDefinition must define handle\(\)"),
        ({"queue": "a,b"}, ValueError, r"invalid queue name 'a,b'"),
        ({"queue": ""}, ValueError, r"invalid queue name ''"),
        ({"queue": None}, ValueError, r"queue name must be a str, got None"),
        ({"priority": 101}, ValueError, r"priority 101 is out of range"),
        ({"priority": True}, ValueError, r"priority must be an int, got True"),
        ({"timeout": -1}, ValueError, r"timeout must be a positive finite number, got -1"),
        ({"timeout": "60"}, ValueError, r"timeout must be a number of seconds or None, got '60'"),
        ({"retry": 3}, TypeError, r"retry must be a django_gator\.Retry or None, got 3"),
        ({"name": ""}, ValueError, r"job name must be a non-empty str"),
        ({"name": "n" * 256}, ValueError, r"at most 255 characters"),
        ({"name": "two\nlines"}, ValueError, r"must not contain line breaks or NUL: 'two\\nlines'"),
        ({"name": "nul\x00"}, ValueError, r"must not contain line breaks or NUL"),
        ({"name": 42}, ValueError, r"job name must be a non-empty str.*got 42"),
    ],
    ids=[
        "no-handle",
        "queue-comma",
        "queue-empty",
        "queue-none",
        "priority-range",
        "priority-bool",
        "timeout-negative",
        "timeout-str",
        "retry-int",
        "name-empty",
        "name-long",
        "name-newline",
        "name-nul",
        "name-int",
    ],
)
def test_bad_class_definitions_are_refused_and_not_registered(namespace, error, pattern):
    if namespace:  # all but the first case have a handle(), so only the bad option counts
        namespace = {"handle": lambda self: None, **namespace}
    before = registered_jobs()

    with pytest.raises(error, match=pattern):
        _define_handler(**namespace)

    assert registered_jobs() == before
    assert not Job.objects.exists()


def test_a_good_definition_with_every_option_registers():
    class Configured(Queueable):
        name = "tests.test_registry.configured"
        queue = "emails"
        priority = -100
        retry = Retry(interval=300, max_retries=5, queue="retries")
        timeout = 60

        def handle(self, user_id: int) -> None:
            return None

    assert get_job_class("tests.test_registry.configured") is Configured
    instance = Configured(job_id=7, attempt=2)
    assert (instance.job_id, instance.attempt, instance.queue) == (7, 2, "emails")
    assert Configured(queue="retries").queue == "retries"


# -- traits ----------------------------------------------------------------------------------


def test_a_plain_class_has_the_plain_traits():
    signature = Echo.traits.signature
    assert Echo.traits == JobTraits(signature=signature, accepts_anything=True)
    assert [p.kind for p in signature.parameters.values()] == [
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]
    # Traits are fixed when the class is defined.
    with pytest.raises(dataclasses.FrozenInstanceError):
        Echo.traits.is_unique = True  # type: ignore[misc]


def test_traits_say_async_unique_limited_and_keyed():
    class Fetch(Queueable):
        unique = True

        async def handle(self, url: str, *, depth: int = 1) -> None:
            return None

    class PerAccount(Queueable):
        rate_limit = "10/s"

        def handle(self, account_id: int) -> None:
            return None

        def concurrency_key(self, account_id: int) -> str:
            return f"account:{account_id}"

        def unique_key(self, account_id: int) -> str:
            return str(account_id)

    class Capped(Queueable):
        concurrency_limit = 2

        def handle(self, **kwargs: object) -> None:
            return None

    assert Fetch.traits.is_async
    assert Fetch.traits.is_unique
    assert not (Fetch.traits.is_limited)
    assert not (Fetch.traits.is_keyed)
    assert list(Fetch.traits.signature.parameters) == ["url", "depth"]
    assert not Fetch.traits.accepts_anything
    assert not PerAccount.traits.is_async
    assert PerAccount.traits.is_unique  # unique_key() of its own, unique left False
    assert PerAccount.traits.is_limited
    assert PerAccount.traits.is_keyed
    assert Capped.traits.is_limited
    assert not Capped.traits.is_keyed
    assert not Capped.traits.accepts_anything


def test_job_functions_have_their_functions_traits():
    assert list(add.job_class.traits.signature.parameters) == ["a", "b"]
    assert not add.job_class.traits.is_async
    assert async_record.job_class.traits.is_async
    assert refresh_feed.job_class.traits.is_unique


def test_a_subclass_has_its_own_traits():
    class Base(Queueable):
        def handle(self, a: int) -> None:
            return None

    class Limited(Base):
        concurrency_limit = 1

    assert not Base.traits.is_limited
    assert Limited.traits.is_limited
    assert Limited.traits.signature == Base.traits.signature


def test_a_class_attribute_named_traits_is_refused_not_overwritten():
    with pytest.raises(TypeError, match=r"Shadow\.traits is set by django-gator.*'mine'"):

        class Shadow(Queueable):
            traits = "mine"  # type: ignore[assignment]

            def handle(self) -> None:
                return None
