"""The Celery-compatible front's refusals (every option with no faithful equivalent is
refused where it is written, naming it), its app and settings (task_routes, eager mode,
config_from_object) and its canvas on a real worker: chain, group and chord pass results
on as Celery does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import transaction
from django.test import override_settings

from django_gator.celery import (
    Celery,
    NotSupported,
    chain,
    chord,
    current_app,
    group,
    shared_task,
)
from django_gator.celery.task import set_current
from django_gator.exceptions import GatorError
from django_gator.models import Job
from django_gator.testing import run_jobs
from tests.conftest import run_worker
from tests.testapp import celery_tasks as t

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app():
    """A fresh current app, the previous one put back after the test."""
    previous = t.add.app
    made = Celery("tests")
    yield made
    set_current(previous)


def _define(**options):
    @shared_task(**options)
    def task_with_options():
        pass

    return task_with_options


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("soft_time_limit", 5, "use time_limit"),
        ("acks_late", False, "no acknowledge-before-run mode"),
        ("reject_on_worker_lost", False, "always runs again"),
        ("track_started", False, "always STARTED"),
        ("serializer", "pickle", "stored as JSON"),
        ("base", object, "Queueable subclass"),
        ("rate_limit", "10/m", "every 6 s on each worker"),
        ("retry_kwargs", {"queue": "x"}, "only max_retries and countdown"),
        ("no_such_option", 1, "not a task option django-gator maps"),
    ],
)
def test_task_options_without_an_equivalent_are_refused_by_name(option, value, why):
    with pytest.raises(NotSupported, match=rf"{option}=.*{why}"):
        _define(**{option: value})


def test_accepted_values_of_one_value_options():
    task = _define(acks_late=True, reject_on_worker_lost=True, track_started=True)
    assert task.options["acks_late"] is True


def test_async_functions_are_refused():
    with pytest.raises(NotSupported, match="async def"):

        @shared_task
        async def not_celery():
            pass


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("link", "use chain"),
        ("link_error", "on_error"),
        ("task_id", "ids are the job's own"),
        ("routing_key", "use queue="),
        ("time_limit", "set time_limit= on the task"),
        ("shadow", "name"),
        ("no_such_option", "mapped: args, kwargs, countdown, eta, expires, queue, priority"),
    ],
)
def test_apply_async_options_without_an_equivalent_are_refused_by_name(option, why):
    with pytest.raises(NotSupported, match=rf"apply_async\(\): {option}=.*{why}"):
        t.add.apply_async((1, 2), **{option: 1})
    assert not Job.objects.exists()


def test_retry_options_without_an_equivalent_are_refused():
    @shared_task(bind=True)
    def retries_with_new_arguments(self):
        self.retry(args=(1,))

    result = retries_with_new_arguments.delay()
    run_jobs(raise_errors=False)
    with pytest.raises(NotSupported, match=r"args=.*same arguments"):
        result.get(timeout=1)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="max_retries must be an int"):
        _define(max_retries=-1)
    with pytest.raises(ValueError, match="queue name"):
        _define(queue="")
    with pytest.raises(ValueError, match="autoretry_for must be exception classes"):
        _define(autoretry_for=("IOError",))


def test_task_routes_send_tasks_to_their_queues(app):
    app.conf.task_routes = {
        "tests.testapp.celery_tasks.ad*": {"queue": "routed", "priority": 4},
        "celery-tests.renamed": "named",
    }
    row = Job.objects.get(pk=int(t.add.delay(1, 1).id))
    assert (row.queue, row.priority) == ("routed", 4)
    assert Job.objects.get(pk=int(t.renamed.delay().id)).queue == "named"
    # The call's queue wins, then the task's own, then the route.
    assert Job.objects.get(pk=int(t.add.apply_async((1, 1), queue="mine").id)).queue == "mine"
    app.conf.task_routes = {"tests.testapp.celery_tasks.*": {"queue": "routed"}}
    assert Job.objects.get(pk=int(t.on_emails.delay(1).id)).queue == "emails"
    run_worker("routed")
    assert Job.objects.filter(queue="routed", state="succeeded").count() == 1


def test_task_default_queue(app):
    app.conf.task_default_queue = "celery"
    assert Job.objects.get(pk=int(t.add.delay(1, 1).id)).queue == "celery"


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        (lambda *a, **k: {"queue": "x"}, "router functions"),
        ({"a.*": {"exchange": "x"}}, "'queue' and 'priority'"),
    ],
)
def test_routes_that_cannot_be_followed_are_refused(app, routes, message):
    with pytest.raises(NotSupported, match=message):
        app.conf.task_routes = routes


@override_settings(
    CELERY_TASK_ROUTES={"tests.testapp.celery_tasks.add": {"queue": "from-settings"}},
    CELERY_BROKER_URL="redis://localhost:6379/0",
    CELERY_RESULT_BACKEND="redis://localhost:6379/1",
    CELERY_TASK_SERIALIZER="json",
)
def test_config_from_object_reads_the_django_settings(app):
    app.config_from_object("django.conf:settings", namespace="CELERY")
    assert Job.objects.get(pk=int(t.add.delay(1, 1).id)).queue == "from-settings"
    with override_settings(CELERY_TASK_ALWAYS_EAGER=True):
        assert t.add.delay(2, 2).get(timeout=1) == 4


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("CELERY_TASK_ACKS_LATE", False),
        ("CELERY_TASK_SERIALIZER", "pickle"),
        ("CELERY_WORKER_CONCURRENCY", 4),
        ("CELERY_BEAT_SCHEDULE", {}),
    ],
)
def test_settings_without_an_equivalent_are_refused_by_name(app, setting, value):
    with override_settings(**{setting: value}):
        app.config_from_object("django.conf:settings", namespace="CELERY")
        with pytest.raises(NotSupported, match=rf"{setting}=.*is not supported"):
            t.add.delay(1, 1)


def test_app_task_and_its_options(app):
    @app.task(bind=True, queue="app-queue")
    def of_the_app(self, x):
        return [x, self.request.id]

    assert app.tasks["tests.test_celery_front.of_the_app"] is of_the_app
    result = of_the_app.delay(3)
    run_worker("app-queue")
    assert result.get(timeout=5) == [3, result.id]
    with pytest.raises(NotSupported, match=r"Celery\('x', task_cls=\.\.\.\)"):
        Celery("x", task_cls="mine:Task")
    made = Celery("x", broker="redis://", backend="redis://", include=["tests.celery_sample.tasks"])
    assert made.main == "x"


def test_eager_mode_runs_at_dispatch(app):
    app.conf.task_always_eager = True
    result = t.add.delay(20, 22)
    assert Job.objects.get(pk=int(result.id)).state == "succeeded"
    assert result.get() == 42


def test_chain_passes_each_result_to_the_next_on_a_real_worker():
    result = chain(t.add.s(2, 2), t.add.s(4), t.pair.s(b="x")).delay()
    assert result.state == "PENDING"
    run_worker("default")
    assert result.get(timeout=10) == [8, "x"]
    assert result.successful()


def test_a_chain_into_a_group_gives_each_member_the_result():
    result = chain(t.add.s(1, 1), group(t.add.s(10), t.add.s(20))).delay()
    run_worker("default")
    assert result.get(timeout=10) == [12, 22]


def test_a_group_of_several_tasks_and_its_result_list():
    result = group([t.add.s(1, 2), t.pair.s(5, b="z"), t.add.s(3, 4)]).delay()
    run_worker("default")
    assert result.get(timeout=10) == [3, [5, "z"], 7]


def test_chord_callback_gets_the_list_of_results():
    header = group(t.add.s(i, i) for i in range(6))
    result = chord(header, t.total.s()).delay()
    run_worker("default", concurrency=3)
    assert result.get(timeout=10) == 30
    assert chord(t.add.s(i, 1) for i in range(3))(t.total.s()).id != result.id


def test_a_failed_member_fails_the_chord_with_its_error():
    result = chord([t.add.s(1, 1), t.fails.s()], t.total.s()).delay()
    run_worker("default")
    assert result.state == "FAILURE"
    with pytest.raises(ValueError, match="no good"):
        result.get(timeout=10)


def test_canvas_refusals():
    with pytest.raises(NotSupported, match=r"expires=.*a canvas maps"):
        chain(t.add.s(1, 1), t.add.s(2)).apply_async(expires=10)
    with pytest.raises(NotSupported, match=r"group\(\) of .* is not supported"):
        group(chain(t.add.s(1, 1), t.add.s(2)))
    with pytest.raises(NotSupported, match="link="):
        group(t.add.s(1, 1)).apply_async(link=t.add.s(1))


def test_autodiscover_tasks_imports_the_tasks_modules(app):
    from django_gator.conf import imports

    names, paths = list(imports._requested_names), list(imports._requested_paths)
    try:
        app.autodiscover_tasks(["tests.celery_sample"])
        assert "tests.celery_sample.tasks" in imports.requested_imports()
        app.autodiscover_tasks(related_name="celery_tasks")
        from django_gator import conf

        assert "celery_tasks" in conf.autodiscover_modules()
    finally:
        imports._requested_names[:], imports._requested_paths[:] = names, paths


@override_settings(GATOR_DISPATCH_ON_COMMIT=True)
def test_a_dispatch_deferred_to_the_commit_has_no_id_yet():
    with transaction.atomic():
        result = t.add.delay(1, 1)
        assert result.id is None
        with pytest.raises(GatorError, match=r"no id yet.*GATOR_DISPATCH_ON_COMMIT"):
            result.get(timeout=1)
    assert Job.objects.filter(name="tests.testapp.celery_tasks.add").count() == 1


def test_a_setting_without_an_equivalent_is_refused_when_a_task_is_defined(app):
    with override_settings(CELERY_WORKER_PREFETCH_MULTIPLIER=1):
        app.config_from_object("django.conf:settings", namespace="CELERY")
        with pytest.raises(NotSupported, match="CELERY_WORKER_PREFETCH_MULTIPLIER=1"):

            @app.task
            def defined_under_a_bad_setting():
                pass


def test_current_app_stands_for_the_last_app_made(app):
    current_app.conf.task_default_queue = "via-current-app"
    assert app.conf.task_default_queue == "via-current-app"
    assert Job.objects.get(pk=int(t.add.delay(1, 1).id)).queue == "via-current-app"


def test_autodiscover_before_the_apps_are_ready_imports_at_setup():
    """As in a Django project: proj/celery.py runs before django.setup()."""
    script = (
        "import sys, django\n"
        "from django_gator.celery import Celery\n"
        "app = Celery('proj')\n"
        "app.autodiscover_tasks(related_name='celery_tasks')\n"
        "assert 'tests.testapp.celery_tasks' not in sys.modules\n"
        "django.setup()\n"
        "from django_gator import get_job_class\n"
        "print(get_job_class('tests.testapp.celery_tasks.add').name)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tests.testapp.celery_tasks.add"


def test_conf_reads_like_celerys(app):
    app.conf.broker_url = "redis://localhost"
    assert app.conf.broker_url == app.conf["broker_url"] == "redis://localhost"
    assert app.conf.task_serializer == "json"
    assert app.conf.get("worker_concurrency", 4) == 4
    assert not hasattr(app.conf, "worker_concurrency")
    with pytest.raises(NotSupported, match="worker_concurrency=8"):
        app.conf.worker_concurrency = 8


def test_a_signature_alone():
    partial = t.pair.s("late").set(queue="sig-queue")
    result = partial.delay("early")  # Celery puts the new arguments first
    assert Job.objects.get(pk=int(result.id)).queue == "sig-queue"
    run_worker("sig-queue")
    assert result.get(timeout=5) == ["early", "late"]
    assert t.add.s(1, 2)() == 3  # called: runs here
    with pytest.raises(NotSupported, match=r"countdown=.*queue= only"):
        t.add.s(1).set(countdown=3)


def test_send_task_by_name(app):
    result = app.send_task("celery-tests.renamed", countdown=10)
    assert Job.objects.get(pk=int(result.id)).name == "celery-tests.renamed"
    with pytest.raises(LookupError, match=r"celery-tests\.renamd"):
        app.send_task("celery-tests.renamd")
