"""OpenTelemetry: the dispatch span, the trace context on the row, and the run's span in
another process continuing it (the SDK's in-memory exporter on both sides)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_gator import Chain, Workflow
from django_gator.models import Job
from tests.conftest import run_python, run_worker
from tests.testapp.jobs import Boom, Noop, RecordFailsFirst

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this test only (the global one is put back after, so
    other tests dispatch without tracing)."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    saved = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER_SET_ONCE._done = False
    trace.set_tracer_provider(provider)
    yield exported
    provider.shutdown()
    trace._TRACER_PROVIDER = saved
    trace._TRACER_PROVIDER_SET_ONCE._done = saved is not None


WORKER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from django_gator.worker.queues import parse_queue_specs
    from django_gator.worker.supervisor import WorkerProcess

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)
    WorkerProcess(parse_queue_specs([sys.argv[1]]), concurrency=2, burst=True,
                  install_signal_handlers=False).run()
    spans = [
        {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent_id": s.parent.span_id if s.parent else None,
            "kind": s.kind.name,
            "status": s.status.status_code.name,
            "attributes": dict(s.attributes),
            "events": [e.name for e in s.events],
        }
        for s in exported.get_finished_spans()
    ]
    print(json.dumps(spans))
    """
)


def run_in_another_process(queue: str) -> list[dict]:
    return json.loads(run_python(WORKER, queue).strip().splitlines()[-1])


def test_the_run_span_in_another_process_is_a_child_of_the_dispatch_span(exporter):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /signup") as request:
        ok = Noop.dispatch(queue="traced")
        flaky = RecordFailsFirst.dispatch("f", queue="traced")
        boom = Boom.dispatch("nope", queue="traced")
    dispatched = {s.attributes["gator.job.id"]: s for s in exporter.get_finished_spans()[:3]}
    assert [s.name for s in dispatched.values()] == [
        f"dispatch {Noop.name}",
        f"dispatch {RecordFailsFirst.name}",
        f"dispatch {Boom.name}",
    ]
    request_trace = request.get_span_context().trace_id
    for span in dispatched.values():
        assert span.parent.span_id == request.get_span_context().span_id
        assert span.context.trace_id == request_trace
        assert span.kind == trace.SpanKind.PRODUCER
    stored = Job.objects.get(pk=ok.pk).trace_context
    assert stored["traceparent"].split("-")[2] == f"{dispatched[ok.pk].context.span_id:016x}"

    runs = run_in_another_process("traced")
    by_job: dict[int, list[dict]] = {}
    for span in runs:
        if span["name"].startswith("run "):
            by_job.setdefault(span["attributes"]["gator.job.id"], []).append(span)
    for job, outcomes in ((ok, ["succeeded"]), (flaky, ["failed", "succeeded"]), (boom, ["dead"])):
        spans = sorted(by_job[job.pk], key=lambda s: s["attributes"]["gator.job.attempt"])
        assert [s["attributes"]["gator.job.outcome"] for s in spans] == outcomes
        for attempt, span in enumerate(spans, start=1):
            assert span["trace_id"] == request_trace
            assert span["parent_id"] == dispatched[job.pk].context.span_id
            assert span["kind"] == "CONSUMER"
            assert span["attributes"]["gator.job.name"] == job.name
            assert span["attributes"]["gator.job.queue"] == "traced"
            assert span["attributes"]["gator.job.attempt"] == attempt
    dead = by_job[boom.pk][0]
    assert dead["status"] == "ERROR"
    assert dead["events"] == ["exception"]
    assert by_job[ok.pk][0]["status"] == "UNSET"


def test_dispatch_many_is_one_span_and_one_update_for_all_rows(exporter):
    Noop.dispatch_many([[]] * 5, queue="traced-many")  # warm-up
    exporter.clear()
    with CaptureQueriesContext(connection) as captured:
        jobs = Noop.dispatch_many([[]] * 5, queue="traced-many")
    # The INSERT and the UPDATE of trace_context, in one transaction (its BEGIN and COMMIT
    # are logged as queries by some of Django's backends).
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].split()[0].upper() not in ("BEGIN", "COMMIT")
    ]
    assert len(statements) == 2, statements
    assert statements[1].startswith('UPDATE "django_gator_job" SET "trace_context"') or (
        statements[1].startswith("UPDATE `django_gator_job` SET `trace_context`")
    )
    (span,) = exporter.get_finished_spans()
    assert span.attributes["messaging.batch.message_count"] == 5
    contexts = {
        json.dumps(j.trace_context) for j in Job.objects.filter(pk__in=[j.pk for j in jobs])
    }
    assert len(contexts) == 1
    assert f"{span.context.span_id:016x}" in contexts.pop()


def test_a_workflow_and_a_chain_are_dispatched_in_a_span_as_a_plain_job_is(exporter):
    # One span per workflow (the pipeline's), its context on every first step's row.
    workflow = Workflow("traced flow")
    a = workflow.add(Noop, n=1)
    b = workflow.add(Noop, n=2)
    workflow.add(Noop, after=[a, b])
    workflow.dispatch()
    first = Chain(Noop, Noop).dispatch()
    workflow_span, chain_span = exporter.get_finished_spans()
    assert workflow_span.name == "dispatch traced flow"
    assert workflow_span.attributes["messaging.batch.message_count"] == 2
    assert chain_span.attributes["gator.job.id"] == first.pk
    for span, ids in ((workflow_span, [a.job.pk, b.job.pk]), (chain_span, [first.pk])):
        for row in Job.objects.filter(pk__in=ids):
            assert f"{span.context.span_id:016x}" in row.trace_context["traceparent"]


def test_no_other_connection_sees_a_dispatched_row_before_its_trace_context(exporter):
    """A dispatch outside transaction.atomic(): its INSERT and the UPDATE that writes the
    trace context commit together, so a worker (woken by the commit, or polling) never
    claims a row whose context is not on it yet."""
    other = connection.copy()  # another session on the same database, as a worker's
    seen: list[tuple[int, object]] = []

    def peek(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("UPDATE") and "trace_context" in sql:
            with other.cursor() as cursor:
                cursor.execute("SELECT id, trace_context FROM django_gator_job")
                seen.extend(cursor.fetchall())
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(peek):
            Noop.dispatch(queue="seen")
            Noop.dispatch_many([[]] * 3, queue="seen")
    finally:
        other.close()
    # Rows of an earlier dispatch are seen, with their context; none is ever seen without.
    assert [job_id for job_id, context in seen if not context] == []
    jobs = Job.objects.filter(queue="seen")
    assert len(jobs) == 4
    assert all(job.trace_context for job in jobs)


def test_without_a_configured_sdk_nothing_is_stored_and_no_query_added(
    django_assert_num_queries,
):
    Noop.dispatch(queue="untraced")  # warm-up
    with django_assert_num_queries(1):
        job = Noop.dispatch(queue="untraced")
    assert Job.objects.get(pk=job.pk).trace_context is None
    run_worker("untraced")
    assert Job.objects.get(pk=job.pk).state == "succeeded"


def test_without_a_tracer_provider_a_run_still_carries_its_dispatch_context():
    """No SDK in the worker (the hooks call straight through), but a job dispatched from a
    traced process: the run is in a non-recording span with the dispatch's context, so
    what the job calls can propagate the trace."""
    from django_gator import tracing
    from django_gator.rows import ClaimedJob

    assert tracing._tracer() is None  # no provider configured in this test
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    job = ClaimedJob(
        id=1,
        name=Noop.name,
        args=[],
        kwargs={},
        queue="q",
        priority=0,
        attempts=1,
        rescues=0,
        trace_context={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
    )
    current = tracing.traced_run(job, lambda: trace.get_current_span().get_span_context())
    assert f"{current.trace_id:032x}" == trace_id
    assert not trace.get_current_span().get_span_context().is_valid  # detached after
    job.trace_context = None
    assert tracing.traced_run(job, lambda: "ran") == "ran"


def test_without_opentelemetry_installed_jobs_dispatch_and_run():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        sys.modules["prometheus_client"] = None
        import django
        django.setup()
        from django_gator import tracing
        from django_gator.models import Job
        from tests.conftest import run_worker
        from tests.testapp.jobs import Noop
        assert tracing.trace is None
        job = Noop.dispatch(queue="no-otel")
        run_worker("no-otel")
        job = Job.objects.get(pk=job.pk)
        print(job.state, job.trace_context)
        """
    )
    assert run_python(code).split() == ["succeeded", "None"]


def test_without_a_configured_sdk_a_run_still_continues_its_dispatch_trace():
    """With no tracer provider configured, the run's span is skipped when it would carry
    nothing, but a job whose row holds a dispatch's trace context still runs inside it
    (so the job's own outgoing calls propagate that trace)."""
    from django_gator import tracing
    from django_gator.rows import ClaimedJob
    from tests.factories import claimed_job

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    parent = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}

    def job(trace_context: dict[str, str] | None) -> ClaimedJob:
        return claimed_job(1, name=Noop.name, trace_context=trace_context)

    def current() -> trace.SpanContext:
        return trace.get_current_span().get_span_context()

    inside = tracing.traced_run(job(parent), current)
    assert (inside.trace_id, inside.span_id) == (trace_id, span_id)
    assert not tracing.traced_run(job(None), current).is_valid
