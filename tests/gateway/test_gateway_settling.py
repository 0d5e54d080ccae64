"""A gateway session's task settles once its calls pause, not after each call: an agent calling
tools back to back does not settle and reopen its task at every call (two audit events a call),
and a gateway that stops runs the checks it had pending."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from mcp import Client

from reconcile.mechanisms.mcp.sandbox import READ_VALUE, MCPToolServer
from stopdesk.gateway.app import gateway_app
from stopdesk.models import Event, Task, WorkItem
from stopdrill.sandbox.server import BackgroundServer
from tests.gateway.conftest import POLL_S, answers_recorded
from tests.gateway.test_gateway_calls import MODES, through_gateway, went
from tests.reconcile.conftest import configure_mcp_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
CALLS = 8


def calls_back_to_back(client: Client) -> Any:
    async def body() -> None:
        for n in range(CALLS):
            assert not (await client.call_tool(READ_VALUE, {"key": f"k{n}"})).is_error

    return body()


def settle_events(task: Task) -> dict[str, int]:
    kinds = Event.objects.filter(task=task, kind__in=("task_settled", "task_reopened")).values_list("kind", flat=True)
    return {kind: list(kinds).count(kind) for kind in ("task_settled", "task_reopened")}


def settled(timeout_s: float = 15.0) -> Task:
    deadline = time.monotonic() + timeout_s
    while (task := Task.objects.get()).settled_at is None:
        assert time.monotonic() < deadline, "the session's task did not settle"
        time.sleep(0.05)
    return task


@pytest.mark.parametrize("mode", MODES)
def test_back_to_back_calls_settle_the_session_task_once_after_they_pause(fast, settings, mode):
    party = MCPToolServer(default_seconds=2.0)
    with BackgroundServer(party.app, name="mcp") as upstream:
        configure_mcp_server(settings, "sandbox", url=upstream.url + "/mcp")
        app = lambda: gateway_app(poll_s=POLL_S, settle_quiet_s=4.0)  # noqa: E731
        with BackgroundServer(app, name="gateway") as front:
            url = front.url + "/mcp/sandbox"
            through_gateway(url, calls_back_to_back, mode=mode)
            answers_recorded()
            # The calls went one after another, each quicker than the quiet time: the task never
            # settled between two of them, so it was never reopened either.
            task = Task.objects.get()
            assert WorkItem.objects.filter(task=task, state="completed").count() == CALLS
            assert (task.settled_at, settle_events(task)) == (None, {"task_settled": 0, "task_reopened": 0})
            # Once they have been quiet that long, it settles: once, after its last call ended.
            task = settled()
            assert settle_events(task) == {"task_settled": 1, "task_reopened": 0}
            last_end = max(WorkItem.objects.filter(task=task).values_list("finished_at", flat=True))
            assert task.settled_at >= last_end
            assert sum(went(SimpleNamespace(url=url)).values()) == CALLS


def test_a_gateway_that_stops_runs_the_settle_checks_it_had_pending(fast, settings):
    party = MCPToolServer(default_seconds=2.0)
    with BackgroundServer(party.app, name="mcp") as upstream:
        configure_mcp_server(settings, "sandbox", url=upstream.url + "/mcp")
        app = lambda: gateway_app(poll_s=POLL_S, settle_quiet_s=600.0)  # noqa: E731
        with BackgroundServer(app, name="gateway") as front:
            through_gateway(front.url + "/mcp/sandbox", calls_back_to_back, mode="auto")
            assert Task.objects.get().settled_at is None  # its check is ten minutes away
        # The gateway stopped (its lifespan ended): the check ran then, not in ten minutes.
        task = Task.objects.get()
        assert task.settled_at is not None
        assert settle_events(task) == {"task_settled": 1, "task_reopened": 0}
