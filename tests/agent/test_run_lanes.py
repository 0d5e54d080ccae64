"""Where a framework run's writes happen with the in-process runtime: the process's threads, whose
connections last from run to run, and which commits wait for the disk flush (all of them, unless
the operator opts out of durable results)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from django.db import connection

from stopdesk.agent.frameworks.core import StopdeskRun
from stopdesk.agent.frameworks.lanes import close_connections
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import WorkItem
from stopdesk.states import ItemState as S

pytestmark = pytest.mark.postgres


class Observed(LocalRuntime):
    """The in-process runtime, noting for each write what the database says of the connection it
    runs on: its backend and whether its commits wait for the flush (`synchronous_commit`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, int, bool]] = []  # (what, backend pid, commits wait)
        self.written: list[str] = []  # the results written, as they return

    def _note(self, what: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), current_setting('synchronous_commit')")
            pid, setting = cursor.fetchone()
        self.seen.append((what, pid, setting == "on"))

    def register_started(self, task_id: int, **register: Any) -> int:
        item_id = super().register_started(task_id, **register)
        self._note(f"register {register['noun']}")
        return item_id

    def finish_fast(self, item_id: int, **kwargs: Any) -> None:
        what = f"result {WorkItem.objects.get(pk=item_id).noun}"
        self._note(what)
        super().finish_fast(item_id, **kwargs)
        self.written.append(what)


def observed() -> Observed:
    return Observed(actor="agent:test", dispatch=lambda ids: None)


async def one_turn(runtime: Any, task_id: int, *, body_waits_for: str | None = None) -> None:
    """A model request, then a tool call. `body_waits_for`: the tool's body returns only once that
    result is written (a record of `Observed.written`), so that write is done before the run ends."""

    async def body() -> str:
        await asyncio.sleep(0.01)
        deadline = time.monotonic() + 10
        while body_waits_for is not None and body_waits_for not in runtime.written and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return "12 employees"

    async with StopdeskRun(runtime, task_id, framework="test") as run:
        async with run.model_request():
            await asyncio.sleep(0.01)
        await run.tool_call(call_id="call_1", name="lookup", arguments={"q": "Acme"}, body=body)


def test_every_write_of_a_run_waits_for_the_flush_by_default(runtime):
    recording = observed()
    task = recording.create_task("Look Acme up")

    asyncio.run(one_turn(recording, task.id))

    waits = {what: wait for what, _, wait in recording.seen}
    assert len(recording.seen) == len(waits) == 6, recording.seen
    assert waits == {
        "register agent run": True,  # the run passes the boundary
        "register lookup call": True,  # the tool call's boundary, before its body
        "register draft": True,  # a model request's draft: a record of what the agent did
        "result draft": True,
        "result lookup call": True,  # the tool's result: durable, so a crash cannot lose it
        "result agent run": True,  # the run's end
    }
    states = WorkItem.objects.filter(task_id=task.id).values_list("noun", "state")
    assert sorted(states) == [("agent run", S.COMPLETED), ("draft", S.COMPLETED), ("lookup call", S.COMPLETED)]


def test_with_the_opt_out_results_and_drafts_do_not_wait_and_the_boundary_still_does(runtime, settings):
    settings.STOPDESK = {**settings.STOPDESK, "DURABLE_RESULTS": False}  # STOPDESK_DURABLE_RESULTS=0
    recording = observed()
    task = recording.create_task("Look Acme up")

    # The draft's result goes alone once the tool's body starts, or after the outbox's ride if the
    # draft's registration answers later than that; the body outlasts either (were the run to end
    # first, the result would go with the run's end, which waits, and so would the tool's result
    # be sent alone, not waiting: right, but not what this test looks at).
    asyncio.run(one_turn(recording, task.id, body_waits_for="result draft"))

    waits = {what: wait for what, _, wait in recording.seen}
    assert len(recording.seen) == len(waits) == 6, recording.seen
    assert waits == {
        "register agent run": True,  # the run passes the boundary
        "register lookup call": True,  # the tool call's boundary, before its body
        "register draft": False,  # a model request: a draft with no effect outside
        "result draft": False,  # lost in a crash, it stays running: the reaper's
        # Still waiting when the run ended, so written in the run's end, which always waits.
        "result lookup call": True,
        "result agent run": True,  # the run's end, which flushes all of the above
    }
    states = WorkItem.objects.filter(task_id=task.id).values_list("noun", "state")
    assert sorted(states) == [("agent run", S.COMPLETED), ("draft", S.COMPLETED), ("lookup call", S.COMPLETED)]

    # Back to the default: the same threads' connections wait again.
    settings.STOPDESK = {**settings.STOPDESK, "DURABLE_RESULTS": True}
    recording.seen.clear()
    again = recording.create_task("Look Acme up again")
    asyncio.run(one_turn(recording, again.id))
    assert all(wait for _, _, wait in recording.seen), recording.seen


def test_runs_keep_the_threads_connections_and_replace_one_the_server_closed(runtime):
    # Lanes of this run's own: the process's lanes may hold idle threads from earlier runs, any of
    # which may take the second run's calls.
    close_connections()
    recording = observed()
    first, second, third = (recording.create_task(f"Look Acme up {n}") for n in range(3))

    asyncio.run(one_turn(recording, first.id))
    before = {pid for _, pid, _ in recording.seen}
    recording.seen.clear()
    asyncio.run(one_turn(recording, second.id))
    again = {pid for _, pid, _ in recording.seen}
    # Every thread is the first run's, unless a call found them all busy and started one more.
    assert before & again, "the second run opened new connections instead of using the first run's"

    # The server ends those connections while they sit idle (a restart, an administrator):
    # the next run gets new ones instead of failing on them.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [sorted(before | again)])
    _wait_gone(before | again)
    recording.seen.clear()
    asyncio.run(one_turn(recording, third.id))

    assert {pid for _, pid, _ in recording.seen}.isdisjoint(before | again)
    states = WorkItem.objects.filter(task_id=third.id).values_list("state", flat=True)
    assert sorted(states) == [S.COMPLETED] * 3


def test_close_connections_closes_the_threads_connections(runtime):
    recording = observed()
    task = recording.create_task("Look Acme up")
    asyncio.run(one_turn(recording, task.id))
    pids = {pid for _, pid, _ in recording.seen}

    close_connections()

    _wait_gone(pids)


def _wait_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 5
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s::int[])", [sorted(pids)])
            (left,) = cursor.fetchone()
        if not left:
            return
        assert time.monotonic() < deadline, f"{left} of the connections {sorted(pids)} are still open"
        time.sleep(0.05)
