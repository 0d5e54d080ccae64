"""Over HTTP a result rides on the run's next draft registration instead of a request of its own
(`stopdesk.agent.frameworks.results`): the AsyncClient against a live server, a run without a
framework. Until its carrier goes the item is running, never settled; Stop, an error and the run's
end send every result still waiting at once, and a carrier the boundary refused wrote them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db import connections

from stopdesk.agent.frameworks import results
from stopdesk.agent.frameworks.core import StopdeskRun
from stopdesk.client import AsyncClient, Client
from stopdesk.models import Task, WorkItem
from stopdesk.protocol.errors import StopRequested
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NEVER_ALONE_S = 60.0  # longer than any test: a result that goes alone was sent by Stop or the run's end


async def never() -> None:
    await asyncio.Event().wait()


async def twelve_employees() -> str:
    return "12 employees"


class Agent:
    """The agent's side: a client whose requests are noted (method, path, body)."""

    def __init__(self, url: str, token: str) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.http = httpx.AsyncClient(event_hooks={"request": [self._note]})
        self.client = AsyncClient(url, token, worker="agent", http=self.http)

    async def _note(self, request: httpx.Request) -> None:
        body = json.loads(request.content) if request.content else {}
        self.requests.append((request.method, request.url.path.removeprefix("/api/v1"), body))

    def posted(self, suffix: str) -> list[dict[str, Any]]:
        return [body for method, path, body in self.requests if method == "POST" and path.endswith(suffix)]

    async def close(self) -> None:
        await self.http.aclose()


@pytest.fixture
def agent_http(live_server, transactional_db, monkeypatch) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(results, "RIDE_S", NEVER_ALONE_S)
    return live_server.url, runtime_create(name="framework-agent", actor="test")[1]


def _task(agent_http: tuple[str, str]) -> int:
    with Client(*agent_http) as sd:
        return sd.create_task("Look Acme up").id


async def _ledger[T](read: Callable[[], T]) -> T:
    """A read of the ledger from the test, on a thread of its own (the run's loop is async)."""

    def read_and_close() -> T:
        try:
            return read()
        finally:
            connections.close_all()

    return await asyncio.to_thread(read_and_close)


def _state(item_id: int) -> Callable[[], str]:
    return lambda: WorkItem.objects.get(pk=item_id).state


async def _call(run: StopdeskRun, call_id: str) -> int:
    await run.tool_call(call_id=call_id, name="lookup", arguments={"q": "Acme"}, body=twelve_employees)
    return await _ledger(lambda: WorkItem.objects.get(task_id=run.task_id, handle=call_id).pk)


def test_a_result_leaves_its_item_running_until_the_next_draft_carries_it(agent_http):
    task_id = _task(agent_http)

    async def agent() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        agent = Agent(*agent_http)
        async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
            call = await _call(run, "call_1")
            await asyncio.sleep(0.3)
            seen["waiting"] = await _ledger(_state(call))
            async with run.model_request() as started:
                draft = await run.draft_id(started)
            seen["carried"] = await _ledger(_state(call))
            seen["draft"] = draft
            seen["carriers"] = agent.posted("/items/started")
            seen["alone"] = agent.posted("/result")
        await agent.close()
        return seen

    seen = asyncio.run(agent())

    # Never shown settled before it was written; written by the draft's registration.
    assert (seen["waiting"], seen["carried"]) == (S.RUNNING, S.COMPLETED)
    carrier = next(body for body in seen["carriers"] if body.get("kind") == "model_request")
    assert [r["status"] for r in carrier["results"]] == ["completed"]
    assert seen["alone"] == []  # no request of its own
    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert item.outcome == "12 employees"
    assert WorkItem.objects.get(pk=seen["draft"]).state == S.COMPLETED
    assert Task.objects.get(pk=task_id).settled_at is not None  # the run ended, every item settled


def test_the_runs_end_writes_the_results_still_waiting_at_once(agent_http):
    task_id = _task(agent_http)

    async def agent() -> tuple[float, str]:
        async with (
            AsyncClient(*agent_http, worker="agent") as sd,
            StopdeskRun(sd, task_id, framework="test", watch=never) as run,
        ):
            call = await _call(run, "call_1")
            waiting = await _ledger(_state(call))
            began = time.monotonic()
        return time.monotonic() - began, waiting

    took, waiting = asyncio.run(agent())

    assert waiting == S.RUNNING
    assert took < NEVER_ALONE_S / 4  # sent at the end, not after waiting for a carrier
    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (item.state, item.outcome) == (S.COMPLETED, "12 employees")
    the_run = WorkItem.objects.get(task_id=task_id, noun="agent run")
    assert the_run.state == S.COMPLETED and Task.objects.get(pk=task_id).settled_at is not None


def test_a_run_that_raises_still_writes_the_results_waiting(agent_http):
    task_id = _task(agent_http)

    async def agent() -> None:
        async with (
            AsyncClient(*agent_http, worker="agent") as sd,
            StopdeskRun(sd, task_id, framework="test", watch=never) as run,
        ):
            await _call(run, "call_1")
            raise RuntimeError("the framework broke")

    with pytest.raises(RuntimeError):
        asyncio.run(agent())

    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (item.state, item.outcome) == (S.COMPLETED, "12 employees")
    the_run = WorkItem.objects.get(task_id=task_id, noun="agent run")
    assert (the_run.state, the_run.outcome) == (S.FAILED, "RuntimeError: the framework broke")


def test_stop_sends_the_results_waiting_at_once(agent_http, runtime):
    task_id = _task(agent_http)
    heard = threading.Event()

    async def stop_heard() -> None:
        await asyncio.to_thread(heard.wait, 15)

    async def agent() -> str:
        async with (
            AsyncClient(*agent_http, worker="agent") as sd,
            StopdeskRun(sd, task_id, framework="test", watch=stop_heard) as run,
        ):
            call = await _call(run, "call_1")
            await _ledger(lambda: runtime.request_stop(task_id, reason="operator pressed Stop"))
            heard.set()
            deadline = time.monotonic() + NEVER_ALONE_S / 4
            while (state := await _ledger(_state(call))) == S.RUNNING and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            # Written while the run is still on (the run's end would send it too).
            return state

    assert asyncio.run(agent()) == S.COMPLETED
    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (item.outcome, item.needs_review) == ("12 employees", False)


def test_a_draft_the_boundary_refused_wrote_the_results_it_carried_and_discards_its_answer(agent_http, runtime):
    task_id = _task(agent_http)
    seen: dict[str, Any] = {}

    async def agent() -> None:
        agent = Agent(*agent_http)
        try:
            async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
                await _call(run, "call_1")
                # Stop commits; this run has not heard of it (its watch never answers).
                await _ledger(lambda: runtime.request_stop(task_id, reason="operator pressed Stop"))
                with pytest.raises(StopRequested):
                    async with run.model_request() as started:
                        seen["draft"] = await run.draft_id(started)
                seen["alone"] = agent.posted("/result")
        finally:
            await agent.close()

    asyncio.run(agent())

    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (item.state, item.outcome, item.needs_review) == (S.COMPLETED, "12 employees", False)
    assert seen["alone"] == []  # carried by the refused registration, not sent again
    draft = WorkItem.objects.get(pk=seen["draft"])
    assert (draft.kind, draft.state, draft.started_at) == ("model_request", S.CANCELLED, None)
