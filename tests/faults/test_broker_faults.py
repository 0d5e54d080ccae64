"""The broker (a redis-server of the test's own) stopped when Stop fans out, and restarted empty:
every cancel job Stop queued is lost, and the reconcile sweep, run by beat in a real worker, does
their work from the database. The time from the broker's return to every item known is the
figure."""

from __future__ import annotations

import time

import pytest

from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdesk.models import CancellationAttempt, Event, StopRequest, WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import SETTLED, ItemState, Kind
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.reconcile.conftest import configure_openai

pytestmark = [
    pytest.mark.faults,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

ITEMS = 120  # past the batch threshold: Stop would send them in one chunk to the batched canceller
BOUND_S = 60.0


def test_the_broker_lost_during_the_fanout_and_back_empty_the_sweep_cancels_every_item(settings, own_redis, worker_on):
    party = OpenAIStandin(queue_s=0.02, run_s=600.0)
    with BackgroundServer(party.app, name="openai") as server:
        url = server.url + "/v1"
        configure_openai(settings, base_url=url)
        task = make_task()
        ids = []
        for _ in range(ITEMS):
            item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
            response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft", timeout_s=10)
            ids.append(item.pk)
        worker_on(own_redis.url, extra_env={"OPENAI_BASE_URL": url}, beat=True)

        own_redis.stop()
        outcome = task_request_stop(task_id=task.pk, actor="user:operator", reason="broker down")
        assert outcome.created, "the stop committed: the broker is not the boundary"
        stop = StopRequest.objects.get(task=task)
        assert stop.fanout_done_at is not None and stop.dispatched == ITEMS
        assert not CancellationAttempt.objects.filter(item_id__in=ids).exists(), "no cancel job reached a worker"

        own_redis.start()  # back, and empty: the jobs Stop queued are gone
        back = time.monotonic()
        while time.monotonic() - back < BOUND_S:
            if not WorkItem.objects.filter(pk__in=ids).exclude(state__in=SETTLED).exists():
                break
            time.sleep(0.5)
        recovered_after = time.monotonic() - back

    states = dict(WorkItem.objects.filter(pk__in=ids).values_list("pk", "state"))
    lost = [pk for pk, state in states.items() if state not in SETTLED]
    print(f"fault.broker_lost_fanout items={ITEMS} time_to_known_s={recovered_after:.1f} lost={len(lost)}")
    assert lost == []
    assert set(states.values()) == {ItemState.CANCELLED}
    assert recovered_after <= BOUND_S
    # The sweep did the cancels (its own actor), not a cancel job.
    actors = set(Event.objects.filter(item_id__in=ids, kind="reconciled").values_list("actor", flat=True))
    assert actors == {"system:reconcile"}, actors
