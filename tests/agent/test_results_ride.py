"""Over HTTP a run's results wait for the next tool body and go together in one request
(`stopdesk.agent.frameworks.results`): the AsyncClient against a live server, a run without a
framework. Until then the item is running, never settled; Stop, an error and the run's end send
every result still waiting at once; a batch refused whole goes result by result."""

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
from stopdesk.protocol.errors import NotFound
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


def test_results_leave_their_items_running_until_the_next_tool_body_starts_then_go_in_one_request(agent_http):
    task_id = _task(agent_http)

    async def agent() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        agent = Agent(*agent_http)
        async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
            call = await _call(run, "call_1")
            async with run.model_request() as started:
                draft = await run.draft_id(started)
            await asyncio.sleep(0.3)
            seen["waiting"] = (await _ledger(_state(draft)), await _ledger(_state(call)))

            async def body() -> str:
                # The results waiting went as this body started; the body waits for them here.
                deadline = time.monotonic() + NEVER_ALONE_S / 4
                while await _ledger(_state(call)) == S.RUNNING and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                seen["while_the_body_ran"] = (await _ledger(_state(draft)), await _ledger(_state(call)))
                return "done"

            await run.tool_call(call_id="call_2", name="lookup", arguments={"q": "Acme"}, body=body)
            seen["together"] = agent.posted("/results")
            seen["alone"] = agent.posted("/result")
        await agent.close()
        return seen

    seen = asyncio.run(agent())

    # Never shown settled before they were written; written together while the next body ran.
    assert seen["waiting"] == (S.RUNNING, S.RUNNING)
    assert seen["while_the_body_ran"] == (S.COMPLETED, S.COMPLETED)
    assert [[r["status"] for r in body["results"]] for body in seen["together"]] == [["completed", "completed"]]
    assert seen["alone"] == []  # no request of their own
    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert item.outcome == "12 employees"
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


def test_a_batch_refused_whole_goes_result_by_result_so_one_cannot_hold_back_the_others(agent_http, live_server):
    task_id = _task(agent_http)
    theirs = Client(live_server.url, runtime_create(name="another-agent", actor="test")[1])
    their_call = theirs.register_started(theirs.create_task("Theirs").id, kind="local_worker", noun="lookup")
    theirs.close()

    async def agent() -> list[dict[str, Any]]:
        agent = Agent(*agent_http)
        async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
            await _call(run, "call_1")
            # A result for an item this runtime cannot see (a bug of the agent's own): refused.
            reported = run.later(run.report(their_call, status="completed", detail="not ours"), "report")
            await _call(run, "call_2")
            with pytest.raises(NotFound):
                await reported
            posted = agent.posted("/results")
        await agent.close()
        return posted

    together = asyncio.run(agent())

    assert len(together) == 1 and len(together[0]["results"]) == 2  # the batch, refused whole
    item = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (item.state, item.outcome) == (S.COMPLETED, "12 employees")
    assert WorkItem.objects.get(pk=their_call).state == S.RUNNING


def test_a_normal_end_sends_the_results_waiting_with_the_runs_own_end_in_one_request(agent_http):
    task_id = _task(agent_http)

    async def agent() -> tuple[Agent, int]:
        agent = Agent(*agent_http)
        async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
            await _call(run, "call_1")
            async with run.model_request() as started:
                await run.draft_id(started)  # its record done: only the results are left to write
            run_item = run.item_id
        await agent.close()
        assert run_item is not None
        return agent, run_item

    agent, run_item = asyncio.run(agent())

    (together,) = agent.posted("/results")
    call = WorkItem.objects.get(task_id=task_id, handle="call_1")
    draft = WorkItem.objects.get(task_id=task_id, kind="model_request")
    # The run's own end last, in the same transaction: it settles after its calls' records.
    assert [r["item"] for r in together["results"]] == [call.pk, draft.pk, run_item]
    assert agent.posted("/result") == []  # nothing alone: one request for the run's end
    assert [WorkItem.objects.get(pk=pk).state for pk in (call.pk, draft.pk, run_item)] == [S.COMPLETED] * 3
    assert call.outcome == "12 employees"
    assert Task.objects.get(pk=task_id).settled_at is not None


def test_a_normal_end_whose_one_request_is_refused_still_writes_each_result_and_the_runs_end(agent_http, live_server):
    task_id = _task(agent_http)
    theirs = Client(live_server.url, runtime_create(name="another-agent", actor="test")[1])
    their_call = theirs.register_started(theirs.create_task("Theirs").id, kind="local_worker", noun="lookup")
    theirs.close()

    async def agent() -> tuple[Agent, int, BaseException | None]:
        agent = Agent(*agent_http)
        async with StopdeskRun(agent.client, task_id, framework="test", watch=never) as run:
            await _call(run, "call_1")
            # A result for an item this runtime cannot see, waiting at the run's end: refused.
            reported = run.later(run.report(their_call, status="completed", detail="not ours"), "report")
            run_item = run.item_id
        await agent.close()
        assert run_item is not None
        return agent, run_item, reported.exception()

    agent, run_item, refused = asyncio.run(agent())

    assert isinstance(refused, NotFound)
    first = agent.posted("/results")[0]
    assert first["results"][-1]["item"] == run_item  # the run's end was asked with them, and refused with them
    call = WorkItem.objects.get(task_id=task_id, handle="call_1")
    assert (call.state, call.outcome) == (S.COMPLETED, "12 employees")
    assert WorkItem.objects.get(pk=run_item).state == S.COMPLETED  # then written on its own
    assert WorkItem.objects.get(pk=their_call).state == S.RUNNING
    assert Task.objects.get(pk=task_id).settled_at is not None
