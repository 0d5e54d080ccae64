"""Traces across the HTTP boundary: the Python client sends the agent's W3C traceparent, and the
runtime API's spans (Stop, the reconciliation job, a boundary refusal, an uncertain outcome) are
children of the agent's own spans. A real live server; spans in an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stopdesk.client import Client, StopRequested
from stopdesk.services.runtimes import runtime_create
from stopdesk.tracing import enabled_by_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
_exporter = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    # One provider per process (OpenTelemetry refuses a second); tracing is off unless a test sets it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    yield _exporter


@pytest.fixture
def agent_client(live_server, transactional_db, spans) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    spans.clear()
    token = runtime_create(name="traced-agent", actor="test")[1]
    with Client(live_server.url, token, worker="pytest", timeout=10) as client:
        yield client


@pytest.fixture
def eager() -> Iterator[None]:
    """Stop's reconciliation jobs run in the request's thread, as a worker would run them."""
    from stopdesk.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def _tree(spans: list[ReadableSpan]) -> str:
    """The spans as an indented tree, with their events: what the report shows."""
    children: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for s in spans:
        parent = s.parent.span_id if s.parent and s.parent.span_id in ids else None
        children.setdefault(parent, []).append(s)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.start_time or 0):
            lines.append("  " * depth + f"{s.name} [{s.kind.name.lower()}]")
            lines.extend("  " * depth + f"  * {e.name}" for e in s.events)
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def test_api_spans_are_children_of_the_agents_spans_across_http(agent_client, spans, eager):
    tracer = trace.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent invoices") as agent:
        task = agent_client.create_task("Analyse invoices")
        with tracer.start_as_current_span("execute_tool export_invoices") as tool:
            item = agent_client.register(task.id, kind="external_operation", noun="export", label="export_invoices")
            agent_client.submit(item.id, idempotency_key="call_export_1")
            agent_client.mark_uncertain(item.id, detail="the export timed out")
        queued = agent_client.register(task.id, kind="local_worker", noun="draft", mechanism="celery")
        running = agent_client.register(task.id, kind="model_request", noun="draft", mechanism="manual")
        agent_client.start(running.id)
        agent_client.request_stop(task.id, reason="wrong customer")
        with pytest.raises(StopRequested):
            agent_client.start(queued.id)
    finished = spans.get_finished_spans()
    print("\n" + _tree(list(finished)))
    trace_ids = {s.context.trace_id for s in finished}
    assert trace_ids == {agent.get_span_context().trace_id}  # one trace, the agent's

    server = [s for s in finished if s.kind == trace.SpanKind.SERVER]
    assert len(server) == 9
    by_parent = {s.name: s.parent.span_id for s in server if s.name.endswith("/uncertain")}
    assert by_parent == {"POST /api/v1/items/{item_id}/uncertain": tool.get_span_context().span_id}
    assert all(s.parent.span_id in (agent.get_span_context().span_id, tool.get_span_context().span_id) for s in server)

    (uncertain,) = [e for s in server for e in s.events if e.name == "stopdesk.item_uncertain"]
    assert uncertain.attributes["gen_ai.tool.name"] == "export_invoices"
    assert uncertain.attributes["gen_ai.tool.call.id"] == "call_export_1"
    assert uncertain.attributes["stopdesk.investigate_by"]

    (stop,) = [s for s in finished if s.name == "stopdesk.stop"]
    stop_request = next(s for s in server if s.context.span_id == stop.parent.span_id)
    assert stop_request.name == "POST /api/v1/tasks/{task_id}/stop"
    reconciles = [s for s in finished if s.name == "stopdesk.reconcile"]
    assert reconciles and all(r.parent.span_id == stop.context.span_id for r in reconciles)

    refused_request = next(s for s in server if any(e.name == "stopdesk.boundary_refused" for e in s.events))
    assert refused_request.name == "POST /api/v1/items/{item_id}/start"
    assert refused_request.attributes["http.response.status_code"] == 409


def test_a_request_without_traceparent_starts_its_own_trace(agent_client, spans):
    agent_client.create_task("No agent span around me")
    (server,) = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert server.parent is None


def test_tracing_is_off_unless_the_standard_variables_turn_it_on():
    assert not enabled_by_env({})
    assert enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert enabled_by_env({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not enabled_by_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert not enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})


def test_stop_from_the_dashboard_and_in_process_is_traced_too(spans, transactional_db, cast):
    from django.contrib.auth.models import Group
    from django.test import Client as PageClient

    from stopdesk.agent.runtime import LocalRuntime
    from stopdesk.permissions import roles_ensure
    from tests.factories import make_task

    roles_ensure()
    cast["operator"].groups.add(Group.objects.get(name="operators"))
    operator = PageClient()
    operator.force_login(cast["operator"])
    spans.clear()
    dashboard_task, local_task = make_task(), make_task()
    response = operator.post(f"/tasks/{dashboard_task.pk}/stop/", {"reason": "wrong customer"})
    assert response.status_code in (200, 302), response.status_code
    LocalRuntime(actor="agent:test").request_stop(local_task.pk, reason="done")
    stops = [s for s in spans.get_finished_spans() if s.name == "stopdesk.stop"]
    assert sorted((s.attributes["stopdesk.task.id"], s.attributes["stopdesk.actor"]) for s in stops) == sorted(
        [(dashboard_task.pk, "user:operator"), (local_task.pk, "agent:test")]
    )
