"""Stop's batched canceller SIGKILLed mid-batch, in a real Celery worker: the items its claim held
are cancelled by the sweep within one lease, not after the longest a batch could take."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db.models import Max
from django.utils import timezone

from reconcile.mechanisms.openai import sandbox as faults
from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.services.lease import lease_seconds
from reconcile.services.reconcile import sweep_once
from reconcile.tasks import BATCH_ABOVE
from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import TERMINAL, ItemState, Kind
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.reconcile.conftest import configure_openai
from tests.workers.conftest import wait_for

pytestmark = [
    pytest.mark.faults,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

ITEMS = BATCH_ABOVE + 70  # enough for Stop to send them to the batched canceller in one chunk
SWEEP_EVERY_S = 5.0  # as Celery beat runs reconcile.sweep (stopdesk/settings.py)
BOUND_S = 60.0


def test_a_canceller_killed_mid_batch_frees_its_items_within_one_lease(settings, own_redis, worker_on):
    party = OpenAIStandin(queue_s=0.02, run_s=600.0)
    with BackgroundServer(party.app, name="openai") as server:
        url = server.url + "/v1"
        configure_openai(settings, base_url=url)
        task = make_task()
        items = [_running_response(task, url) for _ in range(ITEMS)]
        # The canceller's calls never come back: it is killed with every one of them out.
        party.set_fault(faults.HANG)
        worker = worker_on(own_redis.url, extra_env={"OPENAI_BASE_URL": url})

        task_request_stop(task_id=task.pk, actor="user:operator", reason="fault drill")
        wait_for(lambda: party.counts.count("cancel") >= 32, timeout=30)
        worker.kill()
        killed = time.monotonic()
        held_for = WorkItem.objects.filter(pk__in=items).aggregate(until=Max("next_check_at"))["until"] - timezone.now()
        party.clear_faults()

        known_after = _sweep_until_known(items, since=killed)

    states = dict(WorkItem.objects.filter(pk__in=items).values_list("pk", "state"))
    lost = [pk for pk, state in states.items() if state not in TERMINAL]
    print(f"fault.canceller_sigkill items={ITEMS} time_to_known_s={known_after:.1f} lost={len(lost)}")
    assert lost == []
    assert set(states.values()) == {ItemState.CANCELLED}
    assert known_after <= BOUND_S
    # The killed batch did hold them (its attempts are on record, unanswered), and only for a lease.
    unanswered = CancellationAttempt.objects.filter(item_id__in=items, answered_at__isnull=True).count()
    assert unanswered >= 32
    assert held_for <= timedelta(seconds=lease_seconds())


def _running_response(task, url: str) -> int:  # type: ignore[no-untyped-def]
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft it", timeout_s=10.0)
    return item.pk


def _sweep_until_known(items: list[int], *, since: float) -> float:
    """Run the sweep at beat's pace until every item is settled; seconds from `since`."""
    while time.monotonic() - since < BOUND_S + 2 * SWEEP_EVERY_S:
        sweep_once()
        if not WorkItem.objects.filter(pk__in=items).exclude(state__in=TERMINAL).exists():
            return time.monotonic() - since
        time.sleep(SWEEP_EVERY_S)
    return time.monotonic() - since
