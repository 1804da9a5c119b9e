"""OpenTelemetry traces (the ``django-gator[otel]`` extra): a span for each dispatch and one
for each run of a job, the run's span a child of the dispatch's, across processes.

The project configures OpenTelemetry (a tracer provider and its exporter, as for its web
requests); django-gator only makes spans with the API. Without ``opentelemetry-api``
installed, or with it and no tracer provider set (a library may have brought the API in),
the two hooks (dispatch and execution) call straight through.

At dispatch, when the dispatch span is being recorded, the span's context (the W3C
``traceparent``, through the configured propagator) is written to the rows' new
``trace_context`` column: one ``UPDATE ... WHERE id IN (...)`` per dispatch call, in the
same transaction as the INSERT (a dispatch outside ``transaction.atomic()`` gets a
transaction of its own for the two), and only when tracing is on. A worker reads it with the
claim and starts the run's span under it, so a job dispatched while serving a request
shows up in that request's trace, however long after and wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import transaction

from django_gator.attempts import Failure, Outcome
from django_gator.rows import ClaimedJob

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django_gator.models import Job

T = TypeVar("T")

SYSTEM = "django-gator"
TRACER = "django_gator"

#: (the tracer provider, our tracer from it): asking the SDK's provider for a tracer at
#: every span cost about a sixth of the span (it builds the instrumentation scope and
#: resets the warnings filters each time).
_cached: tuple[Any, Any] | None = None


def _tracer() -> Any:
    """Our tracer from the configured tracer provider, or None when there is none to
    record spans (no opentelemetry, or no provider set): the hooks then call straight
    through, as spans would record nothing and no context would be stored."""
    global _cached
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(TRACER))
    return cached[1]


def traced_dispatch(
    name: str, queue: str, alias: str, write: Callable[[], Sequence[Job]]
) -> Sequence[Job]:
    """Run ``write`` (the INSERT of one dispatch call; returns the jobs it created) in a
    dispatch span, and store the span's context on the created rows. Until the project
    sets a tracer provider every span is a no-op one: the dispatch does without (a span
    made and made current costs about a tenth of a single dispatch's own Python)."""
    tracer = _tracer()
    if tracer is None:
        return write()
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
        if span.is_recording():
            # The rows and their trace context commit together: a worker woken by the
            # commit (NOTIFY, a datagram) or polling must not claim a row before its
            # context is on it, or the run would start a trace of its own.
            with transaction.atomic(using=alias, savepoint=False):
                created = write()
                if created:
                    _stamp(alias, created)
        else:
            created = write()
        span.set_attribute("messaging.batch.message_count", len(created))
        if len(created) == 1:
            span.set_attribute("gator.job.id", created[0].pk)
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
    tracer = _tracer()
    if tracer is None:
        if trace is None or not job.trace_context:
            return run()
        # No tracer provider here, but the dispatch's context: a non-recording span that
        # carries it, so instrumentation inside the job can still propagate it.
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
    if not isinstance(outcome, Outcome):
        return  # (a caller other than the worker's run)
    label = outcome.label
    span.set_attribute("gator.job.outcome", label)
    if isinstance(outcome, Failure) and label in ("failed", "dead"):
        if outcome.exception is not None:
            span.record_exception(outcome.exception)
        span.set_status(Status(StatusCode.ERROR, outcome.last_error[:200]))
