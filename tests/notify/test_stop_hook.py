"""Stop's credential hook: a `stop_requested` notification with the task, its runtime and the tools
in flight, written with the Stop's commit, signed and delivered like every notification, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from stopdesk.notify.delivery import deliveries_due, delivery_resend, notifications_deliver
from stopdesk.notify.models import Delivery, Notification, WebhookEndpoint, new_webhook_secret
from stopdesk.notify.topics import CHOOSABLE, Topic
from stopdesk.permissions import roles_ensure
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import task_request_stop
from stopdesk.states import DeliveryState, ItemState, Kind
from tests.factories import ACTOR, make_item, make_task
from tests.workers.conftest import wait_for

D = DeliveryState
ROOT = Path(__file__).resolve().parents[2]
S = ItemState
TOOL = {"framework": "langgraph", "name": "send_invoice", "system": "billing", "effect": "created", "declared": True}


def _no_dispatch(ids: list[int]) -> None:
    """The cancellation jobs are another test's subject."""


@pytest.fixture
def hook(receiver_server, db):  # type: ignore[no-untyped-def]
    """An endpoint that names the topic: a receiver built to revoke keys."""
    party, server = receiver_server
    return WebhookEndpoint.objects.create(
        name="revoker", url=server.url + "/hooks", secret=party.secret, topics=[Topic.STOP_REQUESTED]
    )


def _task_with_work():  # type: ignore[no-untyped-def]
    runtime, _token = runtime_create(name="billing-agent", actor=ACTOR)
    task = task_create(title="Send invoices", actor=ACTOR, runtime=runtime)
    sending = make_item(
        task,
        state=S.RUNNING,
        kind=Kind.EXTERNAL_OPERATION,
        noun="invoice",
        label="send_invoice",
        handle="call_1",
        detail={"tool": TOOL},
    )
    drafting = make_item(task, state=S.RUNNING, noun="draft", mechanism="openai", handle="resp_1")
    make_item(task)  # queued: never started, holds nothing
    make_item(task, state=S.COMPLETED)  # done before the Stop
    return runtime, task, sending, drafting


def _hook_notes(task_id: int) -> list[Notification]:
    return list(Notification.objects.filter(topic=Topic.STOP_REQUESTED, task_id=task_id))


@pytest.mark.django_db
def test_a_lost_delivery_job_loses_nothing_the_sweep_delivers_it_signed(hook, receiver, digest_endpoint, settings):
    runtime, task, sending, drafting = _task_with_work()
    task_request_stop(task_id=task.pk, actor="user:ops", reason="leaked key", dispatch=_no_dispatch)
    # Inside the test's transaction no job was queued: as if the broker had lost it.
    (note,) = _hook_notes(task.pk)
    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "LOST_JOB_SECONDS": 0}
    assert note.pk in deliveries_due()
    notifications_deliver([note.pk])
    (got,) = receiver.deliveries()
    assert got["verified"] and got["webhook_id"] == note.message_id
    data = got["payload"]["data"]
    assert got["payload"]["type"] == "stopdesk.stop_requested"
    assert data["task"] == {"id": task.pk, "title": "Send invoices"}
    assert data["runtime"] == {"id": runtime.pk, "name": "billing-agent"}
    assert data["actor"] == "user:ops" and data["reason"] == "leaked key"
    assert data["in_flight_total"] == 2
    by_item = {t["item_id"]: t for t in data["in_flight"]}
    assert set(by_item) == {sending.pk, drafting.pk}
    assert by_item[sending.pk] | {"started_at": None} == {
        "item_id": sending.pk,
        "tool": "send_invoice",
        "system": "billing",
        "framework": "langgraph",
        "kind": Kind.EXTERNAL_OPERATION,
        "mechanism": "manual",
        "handle": "call_1",
        "state": S.RUNNING,
        "started_at": None,
    }
    assert by_item[drafting.pk]["mechanism"] == "openai" and by_item[drafting.pk]["handle"] == "resp_1"
    assert "send_invoice on billing (manual)" in got["payload"]["text"]
    # An endpoint that takes every topic by default does not get it: only those who name it.
    assert list(Delivery.objects.filter(notification=note).values_list("endpoint_id", flat=True)) == [hook.pk]


@pytest.mark.django_db
def test_nobody_listening_writes_nothing_and_a_default_endpoint_does_not_take_it(digest_endpoint):
    task = make_task()
    make_item(task, state=S.RUNNING)
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=_no_dispatch)
    assert _hook_notes(task.pk) == []
    assert not digest_endpoint.wants(frozenset({Topic.STOP_REQUESTED}))
    assert digest_endpoint.wants(frozenset({Topic.STOP_UNSETTLED}))


@pytest.mark.django_db
def test_the_email_topic_is_chosen_where_the_others_are_and_mailed(client, django_user_model, mailoutbox):
    roles_ensure()
    assert Topic.STOP_REQUESTED in CHOOSABLE
    chooser = django_user_model.objects.create_user("kim", email="kim@example.com", password="pw")
    reviewer = django_user_model.objects.create_user("rae", email="rae@example.com", password="pw")
    reviewer.groups.add(*Group.objects.all())  # every role's defaults: none of them is this topic
    client.force_login(chooser)
    page = client.get(reverse("notify-email"))
    assert b'value="stop_requested"' in page.content
    assert client.post(reverse("notify-email"), {"topics": [Topic.STOP_REQUESTED]}).status_code == 302
    _runtime, task, _sending, _drafting = _task_with_work()
    task_request_stop(task_id=task.pk, actor="user:kim", dispatch=_no_dispatch)
    (note,) = _hook_notes(task.pk)
    notifications_deliver([note.pk])
    (mail,) = mailoutbox  # the person who chose it; no role gets it by default
    assert mail.to == ["kim@example.com"]
    assert "Stop of task 'Send invoices' on runtime 'billing-agent' by user:kim: 2 tools in flight" in mail.subject
    assert "send_invoice on billing" in mail.body


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_a_stop_sends_one_hook_through_a_worker_and_a_second_stop_sends_none(
    transactional_db, start_worker, hook, receiver
):
    start_worker("hook@test")
    runtime, task, sending, drafting = _task_with_work()
    first = task_request_stop(task_id=task.pk, actor="user:ops", dispatch=_no_dispatch)  # commits: job queued
    (note,) = _hook_notes(task.pk)
    wait_for(lambda: Delivery.objects.filter(notification=note, state=D.DELIVERED).exists(), timeout=30)
    again = task_request_stop(task_id=task.pk, actor="user:ops", dispatch=_no_dispatch)
    assert first.created and not again.created
    # The second Stop is counted as a duplicate and writes no second notification.
    assert again.stop_request.pk == first.stop_request.pk and again.stop_request.duplicates == 1
    assert _hook_notes(task.pk) == [note]
    (got,) = receiver.deliveries()
    assert got["verified"] and got["webhook_id"] == note.message_id
    assert {t["item_id"] for t in got["payload"]["data"]["in_flight"]} == {sending.pk, drafting.pk}
    assert got["payload"]["data"]["runtime"]["name"] == runtime.name
    assert receiver.duplicates == 0


@pytest.fixture
def example_receiver() -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """docs/examples/stop_hook_receiver.py as written, in its own process on loopback."""
    secret = new_webhook_secret()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "docs" / "examples" / "stop_hook_receiver.py"), "0"],
        env={**os.environ, "STOPDESK_WEBHOOK_SECRET": secret},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    port = json.loads(process.stdout.readline())["listening"]
    yield process, f"http://127.0.0.1:{port}/", secret
    process.terminate()
    process.wait(timeout=10)


@pytest.mark.django_db
def test_the_example_receiver_verifies_and_revokes_the_keys_in_flight_once(example_receiver):
    process, url, secret = example_receiver
    assert process.stdout is not None
    endpoint = WebhookEndpoint.objects.create(name="revoker", url=url, secret=secret, topics=[Topic.STOP_REQUESTED])
    _runtime, task, _sending, _drafting = _task_with_work()
    task_request_stop(task_id=task.pk, actor="user:ops", dispatch=_no_dispatch)
    (note,) = _hook_notes(task.pk)
    assert notifications_deliver([note.pk]) == {D.DELIVERED: 1}  # answered after it revoked
    assert [process.stdout.readline().strip() for _ in range(2)] == [
        f"revoked billing key of runtime billing-agent (stop of task {task.pk})",
        f"revoked draft key of runtime billing-agent (stop of task {task.pk})",
    ]
    # The same webhook-id again (a re-send) is acknowledged and not acted on twice.
    delivery = Delivery.objects.get(notification=note)
    assert delivery_resend(delivery.pk) == D.DELIVERED
    # A message signed with another secret is refused.
    endpoint.secret = new_webhook_secret()
    endpoint.save()
    assert delivery_resend(delivery.pk) != D.DELIVERED
    assert Delivery.objects.get(pk=delivery.pk).last_status == 401
    process.terminate()
    out, _err = process.communicate(timeout=10)
    assert "revoked" not in out
