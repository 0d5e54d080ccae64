"""The stop matrix for in-process asyncio children under the supervisor."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from django.db import connection

from reconcile.services.cancel import item_cancel
from stopdesk.agent.aio import supervise
from stopdesk.models import Event, ExternalRecord, WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.helpers import sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "asyncio": {"deadline_s": 5.0, "recheck_interval_s": 0.5},
        "http": {"call_timeout_s": 0.5},
    }


def child_item(task, noun="draft"):  # type: ignore[no-untyped-def]
    return item_register(task=task, kind=Kind.LOCAL_WORKER, noun=noun, actor="test", mechanism="asyncio")


async def stop_soon(task, delay: float) -> None:  # type: ignore[no-untyped-def]
    await asyncio.sleep(delay)

    def stop() -> None:
        try:
            task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
        finally:
            connection.close()

    await asyncio.to_thread(stop)


def run(coro):  # type: ignore[no-untyped-def]
    try:
        return asyncio.run(coro)
    finally:
        connection.close()


def test_children_that_finish_are_completed(fast):
    task = make_task()
    item = child_item(task)

    async def body(child):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)
        return "ok"

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05) as group:
            group.start(item.pk, body)

    run(main())
    item.refresh_from_db()
    assert item.state == S.COMPLETED


def test_queued_child_is_cancelled_by_stop_and_never_runs(fast):
    task = make_task()
    item = child_item(task)
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    ran = []

    async def body(child):  # type: ignore[no-untyped-def]
        ran.append(True)

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05) as group:
            group.start(item.pk, body)

    run(main())
    item.refresh_from_db()
    assert item.state == S.CANCELLED and ran == []


def test_running_child_is_cancelled_and_its_cleanup_runs(fast):
    task = make_task()
    item = child_item(task)
    cleaned = []

    async def body(child):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05) as group:
            group.start(item.pk, body)
            await stop_soon(task, 0.2)

    run(main())
    item.refresh_from_db()
    assert item.state == S.CANCELLED and cleaned == [True]
    assert item.outcome == "cancelled before any external action"
    # The reconciler's read-back agrees with the ledger.
    assert item_cancel(item_id=item.pk).seen == "cancelled"


def test_child_that_ignores_the_cancel_ends_completed_and_says_so(fast):
    task = make_task()
    item = child_item(task)

    async def body(child):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # deliberately finishing the work anyway
            await asyncio.sleep(0.05)
            return "finished anyway"

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05) as group:
            group.start(item.pk, body)
            await stop_soon(task, 0.2)

    run(main())
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed despite the stop"


def test_child_cancelled_after_its_action_was_sent_is_reconciled_to_the_record(fast, crm_party, clock):
    party, base = crm_party
    party.set_fault("hang_after_commit", target="key-a")
    task = make_task()
    item = child_item(task, noun="record")

    async def body(child):  # type: ignore[no-untyped-def]
        await child.declare({"http": {"system": "crm"}})
        await child.submit("key-a")
        async with httpx.AsyncClient() as http:
            await http.post(base + "/records", json={"name": "ACME"}, headers={"Idempotency-Key": "key-a"})

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05) as group:
            group.start(item.pk, body)
            await stop_soon(task, 0.3)

    run(main())
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION  # a cancelled coroutine proves nothing remote
    clock.advance(1)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    record = ExternalRecord.objects.get(item=item)
    assert (record.record_id, record.version) == ("crm-1", "1")


def test_cleanup_that_overruns_is_reconciled_and_ends_uncertain(fast, clock):
    task = make_task()
    item = child_item(task)

    async def body(child):  # type: ignore[no-untyped-def]
        await child.submit("key-x")  # an action with no lookup declared
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.shield(asyncio.sleep(0.6))  # cleanup slower than allowed

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=0.05, cleanup_s=0.1) as group:
            group.start(item.pk, body)
            await stop_soon(task, 0.2)

    run(main())
    item = WorkItem.objects.get(pk=item.pk)
    assert item.state == S.AWAITING_RECONCILIATION and "cleanup did not finish" in item.outcome
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None


def test_child_that_hears_of_stop_itself_is_recorded_cancelled(fast):
    # A child refused at its own boundary (or told by LocalRuntime.heartbeat) raises StopRequested,
    # the one class every door raises: a stop, never a failure.
    task = make_task()
    item = child_item(task)

    async def body(child):  # type: ignore[no-untyped-def]
        await stop_soon(task, 0)
        await child.submit("mail-after-stop")  # the boundary refuses: TaskStopped, a StopRequested

    async def main() -> None:
        async with supervise(actor="agent", poll_s=5.0) as group:
            group.start(item.pk, body)

    run(main())
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.submitted_at is None
    assert not item.needs_review and not Event.objects.filter(item=item, kind="late_result").exists()


def test_stop_is_pushed_to_the_children_of_the_stopped_task_only(fast):
    # Leases renewed hourly: the children can only hear of Stop by push.
    stopped_task, other_task = make_task("stopped"), make_task("goes on")
    stopped_item, other_item = child_item(stopped_task), child_item(other_task)
    heard_at: dict[int, float] = {}

    async def body(child):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            heard_at[child.item_id] = time.monotonic()
            raise

    async def main():  # type: ignore[no-untyped-def]
        async with supervise(actor="agent:test", poll_s=3600) as group:
            group.start(stopped_item.pk, body)
            group.start(other_item.pk, body)
            await asyncio.sleep(0.3)
            asked = time.monotonic()
            await stop_soon(stopped_task, 0)
            return asked

    asked = run(main())
    stopped_item.refresh_from_db()
    other_item.refresh_from_db()
    assert stopped_item.state == S.CANCELLED and other_item.state == S.COMPLETED
    assert list(heard_at) == [stopped_item.pk] and heard_at[stopped_item.pk] - asked < 1.0
