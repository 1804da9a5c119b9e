"""OpenTelemetry traces (the ``django-gator[otel]`` extra): a span for each dispatch and one
for each run of a job, the run's span a child of the dispatch's, across processes.

The project configures OpenTelemetry (a tracer provider and its exporter, as for its web
requests); django-gator only makes spans with the API. Without ``opentelemetry-api``
installed the two hooks (dispatch and execution) call straight through.

At dispatch, when the dispatch span is being recorded, the span's context (the W3C
``traceparent``, through the configured propagator) is written to the rows' new
``trace_context`` column: one ``UPDATE ... WHERE id IN (...)`` per dispatch call, in the
same transaction as the INSERT, and only when tracing is on. A worker reads it with the
claim and starts the run's span under it, so a job dispatched while serving a request
shows up in that request's trace, however long after and wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django_gator.rows import ClaimedJob, Failure, outcome_label

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    #: The API's providers while the project configures none: their spans record nothing.
    _UNCONFIGURED = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django_gator.models import Job

T = TypeVar("T")

SYSTEM = "django-gator"
TRACER = "django_gator"


def traced_dispatch(
    name: str, queue: str, alias: str, write: Callable[[], Sequence[Job]]
) -> Sequence[Job]:
    """Run ``write`` (the INSERT of one dispatch call; returns the jobs it created) in a
    dispatch span, and store the span's context on the created rows. Until the project
    sets a tracer provider every span is a no-op one: the dispatch does without (a span
    made and made current costs about a tenth of a single dispatch's own Python)."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return write()
    tracer = trace.get_tracer(TRACER)
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "publish",
        "messaging.destination.name": queue,
        "gator.job.name": name,
        "gator.job.queue": queue,
    }
    with tracer.start_as_current_span(
        f"dispatch {name}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        created = write()
        span.set_attribute("messaging.batch.message_count", len(created))
        if len(created) == 1:
            span.set_attribute("gator.job.id", created[0].pk)
        if created and span.is_recording():
            _stamp(alias, created)
    return created


def _stamp(alias: str, created: Sequence[Job]) -> None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return
    from django_gator.models import Job

    Job.objects.using(alias).filter(pk__in=[job.pk for job in created]).update(
        trace_context=carrier
    )
    for job in created:
        job.trace_context = carrier


def traced_run(job: ClaimedJob, run: Callable[[], T]) -> T:
    """Run ``run`` (one attempt of ``job``; returns its outcome) in a span that continues
    the trace of the job's dispatch."""
    if trace is None:
        return run()
    if job.trace_context is None and isinstance(trace.get_tracer_provider(), _UNCONFIGURED):
        # No tracer provider is configured and there is no dispatch trace to continue: the
        # span would be a non-recording one that carries no context. Skipping it saves
        # the API's span and context bookkeeping on every job.
        return run()
    tracer = trace.get_tracer(TRACER)
    parent = propagate.extract(job.trace_context) if job.trace_context else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "gator.job.name": job.name,
        "gator.job.queue": job.queue,
        "gator.job.id": job.id,
        "gator.job.attempt": job.attempts,
    }
    with tracer.start_as_current_span(
        f"run {job.name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        outcome = run()
        if span.is_recording():
            _settle(span, outcome)
    return outcome


def _settle(span: Any, outcome: object) -> None:
    label = outcome_label(outcome)
    span.set_attribute("gator.job.outcome", label)
    if isinstance(outcome, Failure) and label in ("failed", "dead"):
        if outcome.exception is not None:
            span.record_exception(outcome.exception)
        span.set_status(Status(StatusCode.ERROR, outcome.last_error[:200]))
