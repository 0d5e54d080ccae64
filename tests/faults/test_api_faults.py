"""Faults at the door and at the far end: a client that hangs up in the middle of its stop POST,
two stops at once over HTTP, and the cancellation endpoint down for the whole deadline."""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlparse

import httpx
import pytest

from stopdesk.models import Event, Runtime, StopRequest
from stopdesk.services.items import item_register, task_create
from stopdesk.services.transitions import item_start
from stopdrill.drills.runner import run_drills
from stopdrill.drills.table import table
from tests.workers.conftest import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def agent(live_server):  # type: ignore[no-untyped-def]
    runtime = Runtime(name="fault-agent")
    token = runtime.issue_token()
    runtime.save()
    task = task_create(title="export invoices", actor="test", runtime=runtime)
    item_register(task=task, kind="local_worker", noun="draft", actor="test")
    running = item_register(task=task, kind="local_worker", noun="export", actor="test")
    item_start(item_id=running.pk, actor="test")
    return {"token": token, "task": task, "url": live_server.url}


def raw_stop(agent, *, send_all: bool) -> None:  # type: ignore[no-untyped-def]
    """POST the stop over a raw socket and close it without reading a byte of the answer."""
    url = urlparse(agent["url"])
    body = json.dumps({"reason": "operator closed the laptop"}).encode()
    head = (
        f"POST /api/v1/tasks/{agent['task'].pk}/stop HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {agent['token']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(head + (body if send_all else body[: len(body) // 2]))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close


def test_a_client_that_hangs_up_mid_body_stops_nothing(agent):
    raw_stop(agent, send_all=False)

    with pytest.raises(TimeoutError):
        wait_for(lambda: StopRequest.objects.exists(), timeout=1.5)
    assert not Event.objects.filter(kind__startswith="stop").exists()


def test_a_client_that_hangs_up_before_the_answer_still_stops_exactly_once(agent):
    raw_stop(agent, send_all=True)

    stop = wait_for(lambda: StopRequest.objects.filter(task=agent["task"], fanout_done_at__isnull=False).first())
    assert (stop.duplicates, stop.queued_cancelled, stop.dispatched) == (0, 1, 1)
    assert Event.objects.filter(task=agent["task"], kind="stop_requested").count() == 1

    # The client, not knowing, presses again: the same stop, one more audit event, nothing re-sent.
    again = httpx.post(
        f"{agent['url']}/api/v1/tasks/{agent['task'].pk}/stop",
        json={},
        headers={"Authorization": f"Bearer {agent['token']}"},
    )
    assert again.status_code == 200 and again.json()["created"] is False
    stop.refresh_from_db()
    assert (StopRequest.objects.count(), stop.duplicates, stop.dispatched) == (1, 1, 1)
    assert Event.objects.filter(task=agent["task"], kind="stop_duplicate").count() == 1


def test_two_stops_at_once_over_http_make_one_stop(agent):
    barrier = threading.Barrier(2)
    answers: list[dict] = []

    def press() -> None:
        barrier.wait(5)
        answer = httpx.post(
            f"{agent['url']}/api/v1/tasks/{agent['task'].pk}/stop",
            json={"reason": "both operators"},
            headers={"Authorization": f"Bearer {agent['token']}"},
            timeout=10,
        )
        answers.append(answer.json())

    threads = [threading.Thread(target=press) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)

    assert sorted(a["created"] for a in answers) == [False, True]
    stop = StopRequest.objects.get()
    assert (stop.duplicates, stop.dispatched) == (1, 1)
    assert Event.objects.filter(kind="cancel_requested").count() == 1, "the running item's cancel went out once"


def test_the_cancellation_endpoint_down_for_the_whole_deadline_leaves_items_uncertain():
    report = run_drills(drills=["cancel_endpoint_down"], mechanisms=["openai", "http"], store=False)

    assert report.passed, table(report)
    assert [o.observed for o in report.outcomes] == ["uncertain", "uncertain"]
    assert report.totals()["lost"] == 0 and report.totals()["after_boundary"] == 0
