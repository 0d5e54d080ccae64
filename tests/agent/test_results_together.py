"""One AsyncClient's `write_results` calls made while one is on its way go together in the next
request (`stopdesk.client.together`), each caller still getting its own answer; and a run ended by
Stop reports its end as a "stopped" result, so runs a Stop of many tasks ends together share
requests. Against a live server, with the agent's requests noted as they leave."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from stopdesk.agent.frameworks.core import RUN_STOPPED, RunStopped, StopdeskRun
from stopdesk.client import Client
from stopdesk.models import WorkItem
from stopdesk.protocol.errors import NotFound
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S
from tests.agent.test_results_ride import Agent

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TOOL = {"kind": "local_worker", "noun": "lookup", "mechanism": "manual", "label": "lookup"}


@pytest.fixture
def agent_http(live_server, transactional_db) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    return live_server.url, runtime_create(name="framework-agent", actor="test")[1]


def _calls(agent_http: tuple[str, str], count: int) -> list[int]:
    with Client(*agent_http) as sd:
        task = sd.create_task("Look Acme up")
        return [sd.register_started(task.id, handle=f"call_{n}", **TOOL) for n in range(count)]


def test_calls_made_while_one_is_on_its_way_go_together_each_answered(agent_http):
    calls = _calls(agent_http, 6)

    async def agent() -> list[dict[str, Any]]:
        agent = Agent(*agent_http)
        try:
            await agent.client.write_results([{"item": calls[0], "status": "completed", "detail": "alone"}])
            # Five callers at once (five runs' results): the first is sent, the others join it.
            await asyncio.gather(
                *(
                    agent.client.write_results([{"item": c, "status": "completed", "detail": "one of five"}])
                    for c in calls[1:]
                )
            )
            return agent.posted("/results")
        finally:
            await agent.close()

    posted = asyncio.run(agent())

    assert [len(body["results"]) for body in posted] == [1, 5]
    assert {item.outcome for item in WorkItem.objects.filter(pk__in=calls[1:])} == {"one of five"}
    assert set(WorkItem.objects.filter(pk__in=calls).values_list("state", flat=True)) == {S.COMPLETED}


def test_one_callers_refused_result_does_not_hold_back_the_others_it_went_with(agent_http):
    calls = _calls(agent_http, 2)
    with Client(agent_http[0], runtime_create(name="another-agent", actor="test")[1]) as theirs:
        their_call = theirs.register_started(theirs.create_task("Theirs").id, **TOOL)

    async def agent() -> tuple[list[Any], list[dict[str, Any]]]:
        agent = Agent(*agent_http)
        try:
            answers = await asyncio.gather(
                agent.client.write_results([{"item": calls[0], "status": "completed", "detail": "mine"}]),
                agent.client.write_results([{"item": their_call, "status": "completed", "detail": "not mine"}]),
                agent.client.write_results([{"item": calls[1], "status": "failed", "detail": "mine too"}]),
                return_exceptions=True,
            )
            return answers, agent.posted("/results")
        finally:
            await agent.close()

    answers, posted = asyncio.run(agent())

    assert answers[0] is None and isinstance(answers[1], NotFound) and answers[2] is None
    # Together (refused whole, nothing written), then each caller's on its own.
    assert [len(body["results"]) for body in posted] == [3, 1, 1, 1]
    assert (WorkItem.objects.get(pk=calls[0]).state, WorkItem.objects.get(pk=calls[1]).state) == (S.COMPLETED, S.FAILED)
    assert WorkItem.objects.get(pk=their_call).state == S.RUNNING


def test_runs_stopped_together_report_their_ends_as_stopped_results_sharing_requests(agent_http):
    with Client(*agent_http) as sd:
        tasks = [sd.create_task(f"Run {n}").id for n in range(5)]
    heard = threading.Event()

    async def stop_heard() -> None:
        await asyncio.to_thread(heard.wait, 15)

    async def one_run(agent: Agent, task_id: int, began: asyncio.Event) -> str:
        try:
            async with StopdeskRun(agent.client, task_id, framework="test", watch=stop_heard) as run:
                began.set()
                await run.run(asyncio.Event().wait())
        except RunStopped:
            return "stopped"
        return "ended"

    async def agent() -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
        agent = Agent(*agent_http)
        try:
            started = [asyncio.Event() for _ in tasks]
            runs = [asyncio.ensure_future(one_run(agent, t, e)) for t, e in zip(tasks, started, strict=True)]
            await asyncio.gather(*(e.wait() for e in started))

            def stop_all() -> None:
                with Client(*agent_http) as sd:
                    for task_id in tasks:
                        sd.request_stop(task_id, reason="operator pressed Stop")

            await asyncio.to_thread(stop_all)
            heard.set()  # every run hears its Stop at once
            ended = await asyncio.gather(*runs)
            return ended, agent.posted("/results"), agent.posted("/stopped")
        finally:
            await agent.close()

    ended, posted, alone = asyncio.run(agent())

    assert ended == ["stopped"] * len(tasks)
    assert alone == []  # no run reported its end in a request of its own
    rows = [row for body in posted for row in body["results"]]
    ends = WorkItem.objects.filter(task_id__in=tasks, noun="agent run")
    assert sorted(row["item"] for row in rows if row["status"] == "stopped") == sorted(e.pk for e in ends)
    assert len(posted) < len(tasks)
    assert {(e.state, e.outcome) for e in ends} == {(S.CANCELLED, RUN_STOPPED)}
