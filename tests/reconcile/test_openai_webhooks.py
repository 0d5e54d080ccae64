"""OpenAI's webhooks as a wake-up, never as the truth: the stand-in sends them, signed, over HTTP
to stopdesk's `/hooks/openai` on a live server, against real PostgreSQL."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from reconcile.mechanisms.openai import sandbox as faults
from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.models import ProviderWebhook
from reconcile.services.cancel import item_cancel
from reconcile.services.webhooks import webhook_wake_recorded
from stopdesk.celery import app as celery_app
from stopdesk.models import CancellationAttempt, Event, WorkItem
from stopdesk.services.items import item_register, item_set_handle
from stopdesk.services.transitions import item_start
from stopdesk.states import ItemState, Kind
from stopdrill.sandbox.server import BackgroundServer
from tests.broker_pools import forget_broker_connections
from tests.factories import make_task
from tests.reconcile.conftest import configure_openai
from tests.reconcile.helpers import stop

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
SECRET = "whsec_" + base64.b64encode(b"stopdesk-test-webhook-secret-32b").decode()


@pytest.fixture
def hooks(settings, live_server) -> Iterator[tuple[OpenAIStandin, str]]:  # type: ignore[no-untyped-def]
    """The stand-in as the openai endpoint, sending its webhooks to the live server's door; the
    read-back a webhook asks for runs in the door's own request (Celery runs eagerly here)."""
    settings.STOPDESK_OPENAI_WEBHOOK_SECRET = SECRET
    eager, celery_app.conf.task_always_eager = celery_app.conf.task_always_eager, True
    party = OpenAIStandin(queue_s=0.02, run_s=0.3, flip_after_s=0.3)
    with BackgroundServer(party.app, name="openai") as server:
        configure_openai(settings, base_url=server.url + "/v1")
        party.configure(webhook_url=live_server.url + "/hooks/openai", webhook_secret=SECRET)
        try:
            yield party, server.url + "/v1"
        finally:
            party.configure(webhook_url="")
            celery_app.conf.task_always_eager = eager


def running_draft(url: str) -> tuple[WorkItem, str]:
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response = response_create(item_id=item.pk, actor="agent", base_url=url, model="gpt-test", input="Draft it")
    item.refresh_from_db()
    return item, response.id


def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def signed(body: dict[str, Any], *, secret: str = SECRET, webhook_id: str = "", age_s: float = 0.0) -> dict[str, Any]:
    """A delivery as OpenAI signs it (Standard Webhooks), `age_s` seconds old."""
    text = json.dumps(body)
    webhook_id = webhook_id or f"wh_{uuid.uuid4().hex}"
    at = datetime.now(tz=UTC) - timedelta(seconds=age_s)
    headers = {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(webhook_id, at, text),
    }
    return {"content": text, "headers": headers}


def event(event_type: str, response_id: str) -> dict[str, Any]:
    return {
        "id": f"evt_{uuid.uuid4().hex}",
        "object": "event",
        "type": event_type,
        "created_at": int(time.time()),
        "data": {"id": response_id},
    }


def attempts(item: WorkItem) -> int:
    return CancellationAttempt.objects.filter(item=item).count()


def test_the_stand_ins_signed_webhook_settles_a_finished_draft_at_once(hooks):
    party, url = hooks
    item, response_id = running_draft(url)
    # Settled, and nothing left scheduled (the read-back's schedule is written just after the move).
    wait_for(lambda: WorkItem.objects.filter(pk=item.pk, state=S.COMPLETED, next_check_at=None).exists())
    item.refresh_from_db()
    # One read-back, by the wake-up, and the record says what the read-back found.
    assert party.counts.count("retrieve", response_id) == 1
    assert item.outcome == "completed" and item.evidence["detail"]["status"] == "completed"
    assert item.finished_at is not None and item.finished_at.timestamp() - party.ended_at(response_id) < 2.0
    delivery = ProviderWebhook.objects.get(handle=response_id)
    assert delivery.event_type == "response.completed" and delivery.woke == 1


def test_a_bad_signature_is_refused_with_400_and_nothing_written(hooks, live_server):
    party, url = hooks
    item, response_id = running_draft(url)
    party.configure(webhook_url="")  # only this test's deliveries
    forged = signed(event("response.completed", response_id), secret="whsec_" + base64.b64encode(b"x" * 32).decode())
    answer = httpx.post(live_server.url + "/hooks/openai", **forged)
    assert answer.status_code == 400
    assert answer.json()["field"] == "webhook-signature" and "signature" in answer.json()["error"]
    unsigned = signed(event("response.completed", response_id))
    del unsigned["headers"]["webhook-signature"]
    answer = httpx.post(live_server.url + "/hooks/openai", **unsigned)
    assert answer.status_code == 400 and answer.json()["field"] == "webhook-signature"
    assert ProviderWebhook.objects.count() == 0 and attempts(item) == 0


def test_an_expired_timestamp_is_refused_even_with_a_good_signature(hooks, live_server):
    party, url = hooks
    item, response_id = running_draft(url)
    party.configure(webhook_url="")
    replayed = signed(event("response.completed", response_id), age_s=301)
    answer = httpx.post(live_server.url + "/hooks/openai", **replayed)
    assert answer.status_code == 400 and "too old" in answer.json()["error"]
    assert ProviderWebhook.objects.count() == 0 and attempts(item) == 0
    fresh = signed(event("response.completed", response_id), age_s=200)  # inside the 300 s tolerance
    assert httpx.post(live_server.url + "/hooks/openai", **fresh).status_code == 200


def test_without_a_secret_the_door_answers_503_and_takes_nothing(hooks, live_server, settings):
    settings.STOPDESK_OPENAI_WEBHOOK_SECRET = ""
    answer = httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", "resp_x")))
    assert answer.status_code == 503 and "OPENAI_WEBHOOK_SECRET" in answer.json()["error"]
    assert ProviderWebhook.objects.count() == 0


def test_an_unknown_response_is_acknowledged_exactly_like_a_known_one(hooks, live_server):
    party, url = hooks
    _item, response_id = running_draft(url)
    party.configure(webhook_url="")
    known = httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", response_id)))
    unknown = httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", "resp_nobody")))
    assert (known.status_code, known.content) == (unknown.status_code, unknown.content) == (200, known.content)
    assert ProviderWebhook.objects.get(handle="resp_nobody").woke == 0


def test_a_duplicate_delivery_reads_back_once(hooks, live_server):
    party, url = hooks
    party.configure(webhook_url="")
    party.run_s = 30.0  # still running: every read-back leaves the item wakeable
    item, response_id = running_draft(url)
    delivery = signed(event("response.completed", response_id), webhook_id="wh_once")
    first = httpx.post(live_server.url + "/hooks/openai", **delivery)
    # The redelivery is re-signed with a new timestamp, as a retry is; same webhook-id.
    again = signed(event("response.completed", response_id), webhook_id="wh_once")
    second = httpx.post(live_server.url + "/hooks/openai", **again)
    assert first.status_code == second.status_code == 200
    assert party.counts.count("retrieve", response_id) == 1 and attempts(item) == 1
    assert ProviderWebhook.objects.filter(webhook_id="wh_once").count() == 1
    # Another delivery (a new webhook-id) is read back: only the copy was dropped.
    httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", response_id)))
    assert attempts(item) == 2


def test_the_stand_in_duplicating_every_delivery_still_reads_back_once(hooks):
    party, url = hooks
    party.configure(webhook_duplicate_rate=1.0, webhook_jitter_s=0.2)
    item, response_id = running_draft(url)
    wait_for(lambda: len([s for s in party.webhooks_sent() if s["response_id"] == response_id]) == 2)
    sent = [s for s in party.webhooks_sent() if s["response_id"] == response_id]
    assert {s["webhook_id"] for s in sent} == {sent[0]["webhook_id"]} and {s["status"] for s in sent} == {200}
    assert party.counts.count("retrieve", response_id) == 1
    assert WorkItem.objects.get(pk=item.pk).state == S.COMPLETED


def test_out_of_order_events_of_a_flip_end_as_the_read_back_says(
    hooks, live_server, django_capture_on_commit_callbacks
):
    """A cancel that flips: `response.completed` delivered before `response.cancelled`. The
    record is what the read-backs found: cancelled, then a late `completed` flagged for review."""
    party, url = hooks
    party.configure(webhook_url="")  # the test delivers the events itself, in the wrong order
    party.run_s = 30.0
    party.arm(faults.FLIP_TO_COMPLETED)
    item, response_id = running_draft(url)
    item_cancel(item_id=stop(item.task, django_capture_on_commit_callbacks)[0])  # its read-back: cancelled
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    wait_for(lambda: party.get(response_id)["status"] == "completed")
    door = live_server.url + "/hooks/openai"
    assert httpx.post(door, **signed(event("response.completed", response_id))).status_code == 200
    assert httpx.post(door, **signed(event("response.cancelled", response_id))).status_code == 200
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.needs_review  # the late result, never an overwrite
    late = Event.objects.get(item=item, kind="late_result")
    assert late.data["reported"] == S.COMPLETED
    # The cancel's read-back and the first delivery's; the second delivery finds the late result
    # recorded and waiting for a person, and reads nothing.
    assert attempts(item) == 2


def test_the_read_back_wins_over_what_the_webhook_says(hooks, live_server):
    party, url = hooks
    party.configure(webhook_url="")
    party.run_s = 30.0
    item, response_id = running_draft(url)
    before = WorkItem.objects.get(pk=item.pk).next_check_at
    # "completed", says the delivery; the read-back finds it still in progress.
    answer = httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", response_id)))
    assert answer.status_code == 200
    item.refresh_from_db()
    assert item.state == S.RUNNING and attempts(item) == 1
    assert item.next_check_at == before  # no schedule, no deadline started by a delivery
    # "cancelled", says another; the response completed: the record says completed.
    party.finish(response_id, "completed")
    httpx.post(live_server.url + "/hooks/openai", **signed(event("response.cancelled", response_id)))
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.evidence["detail"]["status"] == "completed"


def test_a_webhook_before_the_response_is_recorded_loses_nothing(
    hooks, live_server, django_capture_on_commit_callbacks
):
    """The delivery overtakes the create's answer: acknowledged and kept; the handle, once
    recorded, asks for the read-back, and Stop's own read-back settles it anyway."""
    party, url = hooks
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    item_start(item_id=item.pk, actor="agent")
    client = __import__("openai").OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    response = client.responses.create(model="gpt-test", input="Draft it", background=True)
    wait_for(lambda: any(s["response_id"] == response.id and s["status"] == 200 for s in party.webhooks_sent()))
    assert ProviderWebhook.objects.get(handle=response.id).woke == 0
    assert WorkItem.objects.get(pk=item.pk).state == S.RUNNING  # nothing to wake yet
    item_set_handle(item_id=item.pk, handle=response.id, actor="agent")  # e.g. over the runtime API
    assert webhook_wake_recorded(mechanism="openai", handle=response.id) == [item.pk]
    assert webhook_wake_recorded(mechanism="openai", handle=response.id) == []  # once
    item_cancel(item_id=stop(task, django_capture_on_commit_callbacks)[0])  # Stop's own read-back
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.evidence["detail"]["status"] == "completed"


def test_a_redelivery_to_another_web_process_is_still_a_duplicate(hooks, live_server):
    """The dedupe is a row in PostgreSQL, not a process's memory: a redelivery that reaches a
    second web door (a restarted process, another replica) with nothing cached wakes nothing."""
    from django.test.testcases import LiveServerThread, _StaticFilesHandler

    from reconcile.views_webhooks import _verifier

    party, url = hooks
    party.configure(webhook_url="")
    party.run_s = 30.0  # still running: a second read-back would be made if the copy got through
    item, response_id = running_draft(url)
    first = signed(event("response.completed", response_id), webhook_id="wh_r")
    assert httpx.post(live_server.url + "/hooks/openai", **first).status_code == 200
    _verifier.cache_clear()
    second = LiveServerThread("127.0.0.1", _StaticFilesHandler)
    second.daemon = True
    second.start()
    second.is_ready.wait()
    try:
        again = signed(event("response.completed", response_id), webhook_id="wh_r")
        answer = httpx.post(f"http://127.0.0.1:{second.port}/hooks/openai", **again, timeout=10)
        assert answer.status_code == 200
    finally:
        second.terminate()
    assert attempts(item) == 1 and party.counts.count("retrieve", response_id) == 1


def test_a_flip_of_an_unstored_response_is_recorded_before_the_response_is_gone(
    hooks, django_capture_on_commit_callbacks
):
    """store=false: the provider keeps the response only a while after it ends. The flip's
    webhook has it read back at once, long before the watch's first scheduled read."""
    party, url = hooks
    party.configure(unstored_retention_s=1.0)
    party.run_s = 30.0
    party.arm(faults.FLIP_TO_COMPLETED)
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response = response_create(item_id=item.pk, actor="agent", base_url=url, model="gpt-test", input="x", store=False)
    item_cancel(item_id=stop(task, django_capture_on_commit_callbacks)[0])
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.next_check_at is not None  # the watch is scheduled
    wait_for(lambda: WorkItem.objects.get(pk=item.pk).needs_review)
    item.refresh_from_db()
    assert item.evidence["late_result"]["reported"] == S.COMPLETED
    time.sleep(1.2)
    assert httpx.get(f"{url}/responses/{response.id}").status_code == 404  # gone now


def test_a_delivery_whose_read_back_cannot_be_queued_is_refused_and_not_kept(hooks, live_server):
    """The broker is down: 503, and the delivery is not kept, so OpenAI's redelivery is taken."""
    party, url = hooks
    party.configure(webhook_url="")
    item, response_id = running_draft(url)
    saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url", "task_publish_retry")}
    celery_app.conf.update(task_always_eager=False, broker_url="redis://127.0.0.1:9/0", task_publish_retry=False)
    forget_broker_connections(celery_app)
    try:
        delivery = signed(event("response.completed", response_id), webhook_id="wh_later")
        answer = httpx.post(live_server.url + "/hooks/openai", **delivery, timeout=30)
    finally:
        celery_app.conf.update(saved)
        forget_broker_connections(celery_app)
    assert answer.status_code == 503 and "deliver again" in answer.json()["error"]
    assert not ProviderWebhook.objects.filter(webhook_id="wh_later").exists()
    again = signed(event("response.completed", response_id), webhook_id="wh_later")
    assert httpx.post(live_server.url + "/hooks/openai", **again).status_code == 200
    assert ProviderWebhook.objects.get(webhook_id="wh_later").woke == 1 and attempts(item) == 1


def test_a_webhook_never_holds_a_stopped_item_from_its_cancel(hooks, live_server, django_capture_on_commit_callbacks):
    """Stop is recorded and its cancel job not yet run when a delivery arrives: the delivery reads
    nothing back, and the cancel job still claims the item, cancels and reads back."""
    party, url = hooks
    party.configure(webhook_url="")
    party.run_s = 30.0
    item, response_id = running_draft(url)
    (stopped,) = stop(item.task, django_capture_on_commit_callbacks)
    answer = httpx.post(live_server.url + "/hooks/openai", **signed(event("response.completed", response_id)))
    assert answer.status_code == 200 and attempts(item) == 0
    assert item_cancel(item_id=stopped).state == S.CANCELLED
    assert party.counts.count("cancel", response_id) == 1
