"""The project's tests, written for Celery (in its eager mode, as many Celery projects
test); only the imports changed."""

import pytest

# Celery:
#   from celery import chain, group
#   from celery.result import AsyncResult
from django_gator.celery import AsyncResult, chain, group
from tests.celery_sample import tasks
from tests.celery_sample.celery_app import app

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def eager():
    app.conf.update(task_always_eager=True, task_eager_propagates=False)
    tasks.CALLS.clear()
    yield
    app.conf.update(task_always_eager=False)


def test_a_task_called_directly_runs_here():
    assert tasks.add(2, 3) == 5


def test_delay_returns_the_result():
    result = tasks.add.delay(2, 3)
    assert result.get(timeout=10) == 5
    assert result.successful()
    assert result.state == "SUCCESS"
    assert AsyncResult(result.id).get() == 5


def test_apply_runs_now():
    assert tasks.mul.apply((3, 4)).get() == 12


def test_a_bound_task_retries_until_it_succeeds():
    result = tasks.fetch.delay("a", 2)
    assert result.get() == {"key": "a", "calls": 3, "retries": 2}


def test_past_max_retries_the_error_is_raised():
    result = tasks.fetch.delay("b", 10)
    with pytest.raises(tasks.ServiceDown):
        result.get()
    assert result.failed()
    assert tasks.CALLS["b"] == 4  # the first run and 3 retries


def test_autoretry_gives_up_after_max_retries():
    result = tasks.sync_account.delay(7)
    assert result.state == "FAILURE"
    assert isinstance(result.result, tasks.ServiceDown)
    assert tasks.CALLS["sync-7"] == 3


def test_eager_propagates_raises_at_once():
    app.conf.task_eager_propagates = True
    with pytest.raises(tasks.ServiceDown):
        tasks.sync_account.delay(8)


def test_max_retries_exceeded_can_be_caught():
    assert tasks.give_up.delay().get() == "gave up"


def test_request_id_is_the_result_id():
    result = tasks.whoami.delay()
    assert result.get() == {"id": result.id, "queue": "emails"}


def test_ignore_result():
    assert tasks.log_line.delay("x").get() is None


def test_chain_passes_each_result_on():
    assert chain(tasks.add.s(2, 2), tasks.add.s(4), tasks.mul.s(8)).delay().get() == 64


def test_immutable_signature_ignores_the_previous_result():
    assert (tasks.add.s(1, 1) | tasks.mul.si(5, 5)).delay().get() == 25


def test_group_returns_every_result_in_order():
    assert group(tasks.add.s(i, i) for i in range(5)).delay().get() == [0, 2, 4, 6, 8]


def test_chord_totals_the_group():
    assert tasks.sum_of_doubles([1, 2, 3]).get() == 12
