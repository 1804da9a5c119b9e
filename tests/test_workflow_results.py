"""Results between steps (issue 34, item 1): a step's return value reaches the steps after
it through ``self.results()``, keyed by step name (a batch step: its members' results in
order; a chain: the previous job's); steps are named and ``after`` takes names; a result
past GATOR_MAX_RESULT_BYTES fails its attempt instead of being stored cut short."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_gator import Chain, Workflow
from django_gator.models import Job, JobState, WorkflowStep
from tests.conftest import run_worker
from tests.testapp.jobs import Gathers, Produces, ReturnsTooMuch

pytestmark = pytest.mark.django_db(transaction=True)


def _result(job: Job) -> object:
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, (job.state, job.errors)
    return job.result


def _step_job(run: object, name: str) -> Job:
    step = WorkflowStep.objects.get(workflow=run, label=name)
    return Job.objects.get(pk=step.job_id)


def test_named_steps_hand_their_results_to_their_dependents():
    wf = Workflow(name="order 42")
    a = wf.add(Produces, {"rows": 3}, name="fetch_a")
    wf.add(Produces, [1, 2], name="fetch_b")
    wf.add(Gathers, "m", after=[a, "fetch_b"], name="merge")
    wf.add(Gathers, "last", after=["merge"])
    run = wf.dispatch()

    run_worker("results")

    merged = _result(_step_job(run, "merge"))
    assert merged == {"results": {"fetch_a": {"rows": 3}, "fetch_b": [1, 2]}, "extra": "m"}
    last = _result(_step_job(run, "3"))  # unnamed: its position
    assert last == {"results": {"merge": merged}, "extra": "last"}


def test_a_batch_steps_results_arrive_as_a_list_in_the_order_of_its_members():
    wf = Workflow(name="fan out")
    wf.add_batch(Produces, [[i * 10] for i in range(6)], name="parts")
    wf.add(Gathers, after=["parts"], name="sum")
    run = wf.dispatch()

    run_worker("results", concurrency=3)

    assert _result(_step_job(run, "sum")) == {
        "results": {"parts": [0, 10, 20, 30, 40, 50]},
        "extra": None,
    }


def test_each_job_of_a_chain_sees_the_previous_ones_result():
    first = Chain(Produces, Gathers, Gathers).dispatch("seed")

    run_worker("results")

    jobs = list(Job.objects.filter(chain_id=first.chain_id).order_by("chain_position"))
    assert [j.state for j in jobs] == [JobState.SUCCEEDED] * 3
    assert jobs[0].result == "seed"
    assert jobs[1].result == {"results": {"0": "seed"}, "extra": "seed"}
    assert jobs[2].result == {"results": {"1": jobs[1].result}, "extra": "seed"}


def test_a_job_outside_a_workflow_and_a_first_step_have_no_results():
    job = Gathers.dispatch("alone")
    wf = Workflow(name="first")
    wf.add(Gathers, "root")
    run = wf.dispatch()

    run_worker("results")

    assert _result(job) == {"results": {}, "extra": "alone"}
    assert _result(_step_job(run, "0")) == {"results": {}, "extra": "root"}


def test_a_chain_passes_keyword_arguments_named_like_step_options_to_its_jobs():
    first = Chain(Gathers).dispatch(extra={"name": "kept"})
    assert first.kwargs == {"extra": {"name": "kept"}}
    wf = Workflow(name="add_step")
    step = wf.add_step(Produces, [], {"value": "v"}, name="p")
    assert step.name == "p"
    assert step.kwargs == {"value": "v"}


def test_bad_step_names_and_unknown_dependencies_are_refused_naming_the_value():
    wf = Workflow(name="names")
    wf.add(Produces, 1, name="fetch")
    with pytest.raises(ValueError, match="has a step named 'fetch' already"):
        wf.add(Produces, 2, name="fetch")
    with pytest.raises(ValueError, match="all digits"):
        wf.add(Produces, 2, name="7")
    with pytest.raises(ValueError, match="non-empty str"):
        wf.add(Produces, 2, name="")
    with pytest.raises(ValueError, match=r"no step named 'merge' \(steps so far: 'fetch'\)"):
        wf.add(Gathers, after=["merge"])
    with pytest.raises(TypeError, match="after= takes a list of steps"):
        wf.add(Gathers, after="fetch")
    assert len(wf.steps) == 1


@override_settings(GATOR_MAX_RESULT_BYTES=1000)
def test_a_result_over_the_bound_fails_the_attempt_and_a_smaller_one_is_stored():
    small = ReturnsTooMuch.dispatch(990)  # 992 bytes of JSON with its quotes
    big = ReturnsTooMuch.dispatch(1000)

    run_worker("results")

    assert _result(small) == "x" * 990
    big.refresh_from_db()
    assert big.state in (JobState.WAITING, JobState.DEAD), big.state
    assert big.result is None, "nothing was stored cut short"
    error = big.errors[-1]
    assert error["class"] == "django_gator.exceptions.ResultTooLarge"
    assert f"job {big.pk}" in error["message"]
    assert "1002 bytes" in error["message"]
    assert "GATOR_MAX_RESULT_BYTES=1000" in error["message"]


def test_the_workflow_graph_shows_a_named_step_by_its_name():
    from django_gator.admin.workflows import render_graph

    wf = Workflow(name="graph")
    wf.add(Produces, 1, name="fetch_a")
    wf.add(Gathers, after=["fetch_a"])
    svg = render_graph(wf.dispatch())

    assert ">0. fetch_a<" in svg
    assert "<title>step 0 &#x27;fetch_a&#x27;: tests.testapp.jobs.Produces (waiting)" in svg
    assert ">1. Gathers<" in svg, "an unnamed step keeps its job's short name"
    assert "<title>step 1: tests.testapp.jobs.Gathers (blocked)" in svg


def test_the_workflow_page_shows_each_steps_result_redacted_like_arguments(admin_client):
    from django.urls import reverse

    wf = Workflow(name="page")
    wf.add(Produces, {"rows": 3, "password": "hunter2"}, name="fetch_a")
    wf.add(Gathers, after=["fetch_a"])
    run = wf.dispatch()
    run_worker("results")

    page = admin_client.get(reverse("admin:django_gator_workflowrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "0 (fetch_a)" in text
    assert "&quot;rows&quot;: 3" in text
    assert "&quot;password&quot;: &quot;[redacted]&quot;" in text
    assert "hunter2" not in text, "a key of GATOR_REDACT is masked in the results column"
