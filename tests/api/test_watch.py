"""Stop pushed: the watch endpoint and the client's watch_stop() answer the moment Stop commits,
through one listening connection per process."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from stopdesk.client import AsyncClient, Client
from stopdesk.protocol.errors import StopdeskError
from stopdesk.push.hub import StopHub, stop_hub
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from tests.api.watching import NO_DISPATCH, stop_later

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_watch_stop_is_set_the_moment_stop_commits(live_server, runtime_token):
    runtime, token = runtime_token
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime)
    with Client(live_server.url, token) as sd:
        watch = sd.watch_stop(task.pk, poll_s=20)
        assert not watch.wait(0.5), "set before any Stop"
        stopper = stop_later(task.pk, 0.0)
        started = time.monotonic()
        assert watch.wait(10)
        waited = time.monotonic() - started
        stopper.join()
    assert watch.info is not None and watch.info.stopped and watch.info.stop_requested_at is not None
    # Well under the 20 s long poll: the answer came by push, not at the poll's end.
    assert waited < 5


def test_a_watch_of_a_stopped_task_answers_at_once_and_a_quiet_one_times_out(live_server, runtime_token):
    runtime, token = runtime_token
    quiet = task_create(title="quiet", actor="test", runtime=runtime)
    stopped = task_create(title="stopped", actor="test", runtime=runtime)
    task_request_stop(task_id=stopped.pk, actor="test", **NO_DISPATCH)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=live_server.url + "/api/v1", headers=headers, timeout=10) as http:
        at_once = http.get(f"/tasks/{stopped.pk}/stop/watch", params={"timeout": 20})
        assert at_once.status_code == 200 and at_once.json()["stopped"] is True
        started = time.monotonic()
        later = http.get(f"/tasks/{quiet.pk}/stop/watch", params={"timeout": 0.3})
        assert later.json() == {"task": quiet.pk, "stopped": False, "stop_requested_at": None}
        assert 0.25 < time.monotonic() - started < 5


def test_a_watch_needs_the_runtimes_token_and_its_own_task(live_server, runtime_token):
    _, token = runtime_token
    other, _ = runtime_create(name="someone-else", actor="test")
    theirs = task_create(title="theirs", actor="test", runtime=other)
    base = live_server.url + "/api/v1"
    assert httpx.get(f"{base}/tasks/{theirs.pk}/stop/watch").status_code == 401
    headers = {"Authorization": f"Bearer {token}"}
    answer = httpx.get(f"{base}/tasks/{theirs.pk}/stop/watch", headers=headers)
    assert answer.status_code == 404 and answer.json()["error"] == "not_found"
    bad = httpx.get(f"{base}/tasks/{theirs.pk}/stop/watch", params={"timeout": "soon"}, headers=headers)
    assert bad.status_code == 422 and bad.json()["field"] == "timeout"


def test_the_async_client_watch_returns_when_stop_commits(live_server, runtime_token):
    runtime, token = runtime_token
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime)
    stopper = stop_later(task.pk, 0.3)

    async def main() -> float:
        async with AsyncClient(live_server.url, token) as sd:
            started = time.monotonic()
            info = await asyncio.wait_for(sd.watch_stop(task.pk, poll_s=20), 10)
            assert info.stopped
            return time.monotonic() - started

    waited = asyncio.run(main())
    stopper.join()
    assert waited < 5


def test_one_listening_connection_serves_every_watcher_in_a_process():
    hub = StopHub()
    tasks = [task_create(title=f"t{n}", actor="test") for n in range(200)]
    try:
        _watch_many(hub, tasks)
    finally:
        hub.close()


def _watch_many(hub, tasks):  # type: ignore[no-untyped-def]
    woken: dict[int, threading.Event] = {t.pk: threading.Event() for t in tasks}
    for t in tasks:
        hub.watch(t.pk, lambda task_id, _: woken[task_id].set())
    assert hub.listening.wait(10)
    for t in tasks[:3]:
        task_request_stop(task_id=t.pk, actor="test", **NO_DISPATCH)
    assert all(woken[t.pk].wait(5) for t in tasks[:3])
    assert not any(woken[t.pk].is_set() for t in tasks[3:])
    assert hub.connections == 1 and hub.watching() == 197


def test_the_process_hub_is_one_object():
    assert stop_hub() is stop_hub()


def test_local_runtime_watch_stop_is_set_by_push(runtime_token):
    from stopdesk.agent.runtime import LocalRuntime

    runtime, _ = runtime_token
    sd = LocalRuntime(runtime=runtime)
    task = sd.create_task("Analyse invoices")
    watch = sd.watch_stop(task.id)
    assert not watch.wait(0.3)
    stopper = stop_later(task.id, 0.0)
    assert watch.wait(5) and watch.info is not None and watch.info.stopped
    stopper.join()


def test_a_web_door_that_sends_watches_round_in_a_circle_ends_the_watch_with_the_reason(
    live_server, runtime_token, settings
):
    runtime, token = runtime_token
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime)
    settings.STOPDESK_WATCH_URL = live_server.url  # the web door names itself as the watch server
    with Client(live_server.url, token) as sd:
        watch = sd.watch_stop(task.pk, poll_s=20)
        watch._thread.join(10)
    assert not watch.is_set() and watch.error is not None and watch.error.code == "watch_redirect_loop"

    async def main() -> None:
        async with AsyncClient(live_server.url, token) as sd:
            await asyncio.wait_for(sd.watch_stop(task.pk, poll_s=20), 10)

    with pytest.raises(StopdeskError) as refused:
        asyncio.run(main())
    assert refused.value.code == "watch_redirect_loop"


def test_a_look_with_no_wait_is_answered_by_the_web_door_itself_when_watches_go_elsewhere(
    live_server, runtime_token, settings
):
    """`task_stopped` (a watch with timeout=0) holds no thread, so the web door answers it even
    when a watch server takes the waiting watches; before, it got the 307 meant for a waiting
    watch and the client failed to read it as an answer."""
    runtime, token = runtime_token
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime)
    settings.STOPDESK_WATCH_URL = "http://127.0.0.1:9"  # nothing listens there: a follow would fail
    with Client(live_server.url, token) as sd:
        assert sd.task_stopped(task.pk) is False
        task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
        assert sd.task_stopped(task.pk) is True
        waiting = httpx.get(
            f"{live_server.url}/api/v1/tasks/{task.pk}/stop/watch?timeout=5",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert waiting.status_code == 307 and waiting.json()["error"] == "watch_elsewhere"


def test_the_api_document_names_the_watch_server_when_one_is_configured(settings):
    from stopdesk.api.openapi import document

    document.cache_clear()
    try:
        assert "servers" not in document()["paths"]["/tasks/{task_id}/stop/watch"]
        document.cache_clear()
        settings.STOPDESK_WATCH_URL = "http://watch.example:8001"
        watch_path = document()["paths"]["/tasks/{task_id}/stop/watch"]
    finally:
        document.cache_clear()
    assert watch_path["servers"][0]["url"] == "http://watch.example:8001/api/v1"
    assert "307" in watch_path["get"]["responses"]
