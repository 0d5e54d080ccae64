"""OpenTelemetry traces: off unless the operator configures an exporter with the standard
OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
OTEL_TRACES_EXPORTER=otlp/console); OTEL_SDK_DISABLED=true wins. Without a provider every span
here is the API's no-op span.

What is traced: each runtime API request as a SERVER span whose parent is the caller's W3C
`traceparent` (so the agent's own spans contain ours); Stop, whichever door it came through (the
dashboard, the API, the in-process runtime), and each Celery job (reconciliation is
`stopdesk.reconcile`) as child spans, the job's parent carried in its message headers; a
boundary refusal and an item becoming uncertain as span events. Item attributes follow the GenAI
conventions where they apply (`gen_ai.tool.name`, `gen_ai.tool.call.id`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

tracer = trace.get_tracer("stopdesk")
_RECONCILE_TASKS = frozenset({"reconcile.cancel_item", "reconcile.cancel_items", "reconcile.sweep"})


def enabled_by_env(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def tracing_setup() -> bool:
    """Install the SDK's tracer provider when the environment asks for traces. Idempotent."""
    if not enabled_by_env() or isinstance(trace.get_tracer_provider(), _sdk_provider_class()):
        return False
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the resource detector.
    resource = Resource.create({"service.name": "stopdesk"}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, timeout from OTEL_EXPORTER_OTLP_*
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _sdk_provider_class() -> type:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider


@contextlib.contextmanager
def server_span(headers: Mapping[str, str], name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    """A SERVER span whose parent is the caller's `traceparent` (W3C), when it sent one."""
    parent = propagate.extract(headers)
    with tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes) as span:
        yield span


def item_attributes(item: Any) -> dict[str, Any]:
    """An item as a tool call, in the GenAI conventions' terms, plus our own ids."""
    attributes: dict[str, Any] = {
        "stopdesk.item.id": item.pk,
        "stopdesk.task.id": item.task_id,
        "stopdesk.item.mechanism": item.mechanism,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": item.label or item.noun,
    }
    call_id = item.handle or item.idempotency_key
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    return attributes


def span_event(name: str, attributes: dict[str, Any]) -> None:
    """An event on whatever span is current (a request's, a job's); nothing when none records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


# --- Celery: the publisher's context travels in the message headers ---------------------------

_job_spans: dict[str, tuple[Any, Any]] = {}


def _inject_into_message(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        propagate.inject(headers)


def _job_started(task_id: str = "", task: Any = None, **_: Any) -> None:
    if task is None:
        return
    request = task.request
    carrier = {k: v for k in ("traceparent", "tracestate") if isinstance(v := getattr(request, k, None), str)}
    parent = propagate.extract(carrier) if carrier else None  # eager jobs run in the caller's context
    name = "stopdesk.reconcile" if task.name in _RECONCILE_TASKS else f"celery.run {task.name}"
    span = tracer.start_span(
        name,
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={"celery.task_name": task.name, "celery.task_id": task_id},
    )
    token = context.attach(trace.set_span_in_context(span))
    _job_spans[task_id] = (span, token)


def _job_finished(task_id: str = "", state: str | None = None, **_: Any) -> None:
    found = _job_spans.pop(task_id, None)
    if found is None:
        return
    span, token = found
    if state == "FAILURE":
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    context.detach(token)


def connect_celery_signals() -> None:
    from celery.signals import before_task_publish, task_postrun, task_prerun

    before_task_publish.connect(_inject_into_message, weak=False, dispatch_uid="stopdesk.tracing.inject")
    task_prerun.connect(_job_started, weak=False, dispatch_uid="stopdesk.tracing.prerun")
    task_postrun.connect(_job_finished, weak=False, dispatch_uid="stopdesk.tracing.postrun")
