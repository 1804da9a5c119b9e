"""The contract's inserts: one statement per dispatch call, all or nothing, the caller's
transaction kept; unique keys decided by the database's index."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_gator.engines import get_engine
from django_gator.models import Job, JobState, WorkflowRun, WorkflowStep
from django_gator.rows import InsertRow, JobRows
from django_gator.workflows import Workflow
from tests.engines.conformance import covers, statements, writes
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(count: int, **fields: object) -> JobRows:
    values: dict[str, object] = dict(
        name=_name(),
        queue="echo",
        priority=3,
        run_at=None,
        args=[f"[{n}]" for n in range(count)],
        kwargs=["{}"] * count,
    )
    values.update(fields)
    return JobRows(**values)  # type: ignore[arg-type]


def _name() -> str:
    return Echo.name


@covers("streams_rows", "insert_rows")
def test_a_dispatch_call_is_one_insert_answered_in_the_rows_order():
    engine = get_engine("default")
    calls: list[str] = []
    for count in (1, 25):
        rows = _rows(count)
        assert engine.streams_rows(count) is False  # small calls: settled by the caller
        calls.clear()
        with statements() as sent:
            inserted = engine.insert_rows(
                rows,
                prepare=lambda n: calls.append(f"prepare {n}"),
                meanwhile=lambda answer: calls.append(f"meanwhile {len(answer.ids)}"),
            )
        assert calls == [f"prepare {count}", f"meanwhile {count}"]
        assert len(writes(sent)) == 1, sent
        assert (
            len(inserted.ids)
            == count
            == len(inserted.created_at)
            == len(inserted.next_execution_at)
        )
        stored = Job.objects.filter(pk__in=inserted.ids).order_by("pk")
        assert [j.args for j in stored] == [[n] for n in range(count)]
        assert {(j.state, j.queue, j.priority) for j in stored} == {(JobState.WAITING, "echo", 3)}
        Job.objects.all().delete()


@covers("insert_rows")
def test_an_insert_is_rolled_back_with_the_callers_transaction_or_its_callback():
    engine = get_engine("default")

    def rolled_back() -> None:
        with transaction.atomic():
            engine.insert_rows(_rows(3))
            raise RuntimeError("the caller's transaction ends")

    with pytest.raises(RuntimeError):
        rolled_back()
    assert not Job.objects.exists()

    def refuse(answer: object) -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"), transaction.atomic():
        engine.insert_rows(_rows(3), meanwhile=refuse)
    assert not Job.objects.exists()


@covers("insert_unique")
def test_a_unique_key_with_an_active_job_answers_that_job():
    engine = get_engine("default")
    name = _name()

    def row(key: str) -> InsertRow:
        return InsertRow(
            name=name, args="[]", kwargs="{}", queue="echo", priority=0, run_at=None, unique_key=key
        )

    [(first, _, _, created)] = engine.insert_unique([row("k1")])
    assert created is True
    answer = engine.insert_unique([row("k1"), row("k2"), row("k2")])
    assert [(a[0] == first, a[3]) for a in answer] == [(True, False), (False, True), (False, False)]
    assert answer[1][0] == answer[2][0]
    assert Job.objects.filter(unique_key__in=["k1", "k2"]).count() == 2


@covers("insert_workflow")
def test_a_workflow_is_inserted_whole_or_not_at_all():
    wf = Workflow(name="conformance")
    first = wf.add(Echo, "first")
    wf.add(Echo, "second", after=[first])

    def rolled_back() -> None:
        with transaction.atomic():
            wf.dispatch()
            raise RuntimeError("the caller's transaction ends")

    with pytest.raises(RuntimeError):
        rolled_back()
    assert (WorkflowRun.objects.count(), WorkflowStep.objects.count(), Job.objects.count()) == (
        0,
        0,
        0,
    )

    wf = Workflow(name="conformance")
    first = wf.add(Echo, "first")
    wf.add(Echo, "second", after=[first])
    run = wf.dispatch()
    [root] = Job.objects.all()
    assert (root.args, root.chain_id, root.chain_position) == (["first"], run.id, 0)
    assert WorkflowStep.objects.filter(workflow_id=run.id).count() == 2
