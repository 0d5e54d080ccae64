"""The sandbox outbox over real HTTP: sends are irreversible and never duplicated per key."""

from __future__ import annotations

import time

import httpx
import pytest

from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.server import BackgroundServer

Box = tuple[Outbox, BackgroundServer]

MAIL = {"to": "customer@example.test", "subject": "Your export", "body": "Attached."}


def client(server: BackgroundServer, timeout: float = 5.0) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=timeout)


def send(http: httpx.Client, key: str | None = "task-1/mail-1", mail: dict[str, str] = MAIL) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return http.post("/messages", json=mail, headers=headers)


def test_a_replayed_send_returns_the_same_message_and_sends_once(outbox: Box) -> None:
    party, server = outbox
    http = client(server)

    first = send(http)
    replay = send(http)

    assert first.status_code == 201
    assert replay.status_code == 200
    assert replay.json()["id"] == first.json()["id"]
    assert party.sent_count("task-1/mail-1") == 1
    assert party.counts.count("send", "task-1/mail-1") == 2


def test_reusing_a_key_for_another_message_is_422(outbox: Box) -> None:
    party, server = outbox
    http = client(server)
    send(http)

    assert send(http, mail={**MAIL, "subject": "Other"}).status_code == 422
    assert party.sent_count() == 1


def test_without_a_key_every_post_sends_again(outbox: Box) -> None:
    party, server = outbox
    http = client(server)

    send(http, key=None)
    send(http, key=None)

    assert party.sent_count() == 2


def test_status_lookup_by_key_is_404_when_never_received(outbox: Box) -> None:
    _, server = outbox
    http = client(server)
    message_id = send(http).json()["id"]

    found = http.get("/messages", params={"idempotency_key": "task-1/mail-1"})
    by_id = http.get(f"/messages/{message_id}")
    missing = http.get("/messages", params={"idempotency_key": "task-1/mail-2"})

    assert found.json()["status"] == "sent"
    assert by_id.json()["id"] == message_id
    assert missing.status_code == 404


def test_there_is_no_recall(outbox: Box) -> None:
    party, server = outbox
    http = client(server)
    message_id = send(http).json()["id"]

    assert http.delete(f"/messages/{message_id}").status_code == 405
    assert http.post(f"/messages/{message_id}/recall").status_code == 405
    assert party.messages()[0]["status"] == "sent"


@pytest.mark.parametrize(("fault", "sent"), [("hang", 0), ("hang_after_commit", 1)])
def test_a_timed_out_send_is_resolved_by_lookup(outbox: Box, fault: str, sent: int) -> None:
    party, server = outbox
    party.set_fault(fault, target="task-1/mail-1")

    with pytest.raises(httpx.ReadTimeout):
        send(client(server, timeout=0.3))
    lookup = client(server).get("/messages", params={"idempotency_key": "task-1/mail-1"})

    assert lookup.status_code == (200 if sent else 404)
    assert party.sent_count() == sent


@pytest.mark.parametrize(("fault", "sent"), [("fail_500", 0), ("fail_500_after_commit", 1)])
def test_500_faults_differ_in_whether_the_mail_went_out(outbox: Box, fault: str, sent: int) -> None:
    party, server = outbox
    party.set_fault(fault)

    assert send(client(server)).status_code == 500
    assert party.sent_count() == sent


def test_a_client_that_gives_up_during_the_accept_delay_has_still_sent_the_mail(outbox: Box) -> None:
    party, server = outbox
    party.configure(accept_delay_s=0.4)

    with pytest.raises(httpx.ReadTimeout):
        send(client(server, timeout=0.1))
    assert party.sent_count() == 0  # not accepted yet
    time.sleep(0.5)

    assert party.sent_count("task-1/mail-1") == 1
    assert client(server).get("/messages", params={"idempotency_key": "task-1/mail-1"}).status_code == 200
