"""The batched canceller against the one-item path, on the OpenAI stand-in and real PostgreSQL.

The batch records set-based what the one-item path records one transaction at a time; these tests
hold it to the same end states, audit events and attempts, and to one claim per item when two
batches race.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from reconcile.mechanisms.openai import sandbox as faults
from reconcile.mechanisms.openai.agent import response_create
from reconcile.services.cancel import item_cancel, items_cancel
from reconcile.tasks import BATCH_ABOVE
from stopdesk.models import CancellationAttempt, Event, WorkItem
from stopdesk.services.items import item_finish, item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_start
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.conftest import Clock
from tests.reconcile.helpers import stop, sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

# When the canceller runs, on the test's clock: after the stop request, as a dispatched job does.
CANCELLER_AFTER_S = 0.5
ROLES = ("cancelled", "cancelled_too", "ignores_cancel", "cancel_500", "worker_first", "worker_meanwhile", "flips")


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    settings.STOPDESK_MECHANISMS = {
        "openai": {
            "call_timeout_s": 0.5,
            "deadline_s": 20.0,
            "backoff_initial_s": 1.0,
            "backoff_max_s": 4.0,
            "recheck_interval_s": 0.2,
            "recheck_after_cancelled_s": 2.0,
        }
    }


def start(task, url):  # type: ignore[no-untyped-def]
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft it", timeout_s=10.0)
    item.refresh_from_db()
    return item


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def settle_meanwhile(party, item: WorkItem) -> None:  # type: ignore[no-untyped-def]
    """Once the item's cancel has reached the stand-in (whose answers are slow), its worker
    reports it completed: before the canceller has its read-back, so before it records anything."""
    deadline = time.monotonic() + 10
    while party.counts.count("cancel", item.handle) == 0:
        assert time.monotonic() < deadline, "the cancel never arrived"
        time.sleep(0.01)
    item_finish(item_id=item.pk, succeeded=True, actor="worker", outcome="done")


def run_scenario(party, url, django_capture_on_commit_callbacks, *, batched: bool) -> dict[str, WorkItem]:  # type: ignore[no-untyped-def]
    party.configure(latency_s=0.0, flip_after_s=1.0)
    task = make_task()
    party.arm(faults.IGNORE_CANCEL)
    items = {"ignores_cancel": start(task, url)}
    party.arm(faults.FLIP_TO_COMPLETED)
    items["flips"] = start(task, url)
    for role in ROLES:
        if role not in items:
            items[role] = start(task, url)
    party.set_fault(faults.CANCEL_500, target=items["cancel_500"].handle)
    dispatched = stop(task, django_capture_on_commit_callbacks)
    assert sorted(dispatched) == sorted(i.pk for i in items.values())
    item_finish(item_id=items["worker_first"].pk, succeeded=True, actor="worker", outcome="done")
    # The schedule (retries with backoff, re-checks, the deadline) is counted from the stop
    # request, so the clock that runs it starts at a fixed offset from that request: how long the
    # stop's after-commit work or the machine's load took must not decide how many retries fit.
    requested_at = WorkItem.objects.get(pk=dispatched[0]).cancel_requested_at
    assert requested_at is not None
    clock = Clock(requested_at + timedelta(seconds=CANCELLER_AFTER_S))

    meanwhile = items["worker_meanwhile"]
    if batched:
        party.configure(latency_s=0.3)
        canceller = in_thread(lambda: items_cancel(item_ids=dispatched, mechanism="openai", now=clock.now))
        settle_meanwhile(party, meanwhile)
        canceller.join()
    else:
        for item in items.values():
            if item is not meanwhile:
                item_cancel(item_id=item.pk, now=clock.now)
        party.configure(latency_s=0.3)
        canceller = in_thread(lambda: item_cancel(item_id=meanwhile.pk, now=clock.now))
        settle_meanwhile(party, meanwhile)
        canceller.join()
    party.configure(latency_s=0.0)

    first_pass = {role: _state(item) for role, item in items.items()}
    assert first_pass == {
        "cancelled": S.CANCELLED,
        "cancelled_too": S.CANCELLED,
        "ignores_cancel": S.RUNNING,
        "cancel_500": S.RUNNING,
        "worker_first": S.COMPLETED,
        "worker_meanwhile": S.COMPLETED,
        "flips": S.CANCELLED,
    }
    party.finish(items["ignores_cancel"].handle, "completed")  # the run it ignored the cancel for ends
    time.sleep(1.1)  # past flip_after_s: the flipping response now reads completed
    # The item retrying until its deadline first: a sweep takes every due item, so sweeping the
    # others first would move the clock through their schedules, and the flip watch's runs from
    # when `cancelled` was recorded, in real time: how many retries fit before the deadline would
    # then depend on the machine's speed.
    for item in sorted(items.values(), key=lambda item: item.pk != items["cancel_500"].pk):
        sweep_until_settled(clock, item)
    for item in items.values():
        item.refresh_from_db()
    return items


def _state(item: WorkItem) -> str:
    return WorkItem.objects.values_list("state", flat=True).get(pk=item.pk)


def signature(item: WorkItem, role: str) -> dict[str, Any]:
    """What a person or an auditor can see of an item, without ids and times."""
    events = []
    for event in Event.objects.filter(item=item).order_by("id"):
        evidence = (event.data or {}).get("evidence") or {}
        events.append(
            (
                event.kind,
                event.actor,
                event.from_state,
                event.to_state,
                event.message if event.actor != "test" else "",  # the setup's name ids and keys
                sorted(evidence),
                evidence.get("seen"),
                evidence.get("remote_status"),
                (evidence.get("reconcile") or {}).get("cancel_answered"),
            )
        )
    attempts = [(a.action, a.ok, a.observed_status) for a in CancellationAttempt.objects.filter(item=item)]
    # The first attempt is the canceller's; how many re-checks follow (retries before the deadline,
    # watching a cancelled for a flip) depends on when each pass ran, not on the path.
    attempts = attempts[:1] + sorted(set(attempts[1:]))
    evidence = item.evidence
    return {
        "state": item.state,
        "outcome": item.outcome,
        "needs_review": item.needs_review,
        "next_check": item.next_check_at is not None,
        "investigate_by": item.investigate_by is not None,
        "evidence": sorted(evidence),
        "progress": {k: v for k, v in (evidence.get("reconcile") or {}).items() if k != "since"},
        "events": events,
        "attempts": attempts,
    }


def test_the_batched_canceller_records_what_the_one_item_path_records(
    fast, openai_party, django_capture_on_commit_callbacks
):
    party, url = openai_party
    one_by_one = run_scenario(party, url, django_capture_on_commit_callbacks, batched=False)
    batched = run_scenario(party, url, django_capture_on_commit_callbacks, batched=True)

    for role in ROLES:
        assert signature(batched[role], role) == signature(one_by_one[role], role), role

    # And what that is, spelled out for the batch.
    items = batched
    assert items["cancelled"].outcome == "cancelled; confirmed by read-back"
    assert items["ignores_cancel"].state == S.COMPLETED
    assert items["ignores_cancel"].outcome == "completed anyway; the cancel did not take effect"
    assert items["cancel_500"].state == S.UNCERTAIN and items["cancel_500"].investigate_by is not None
    assert CancellationAttempt.objects.filter(item=items["cancel_500"]).count() >= 4
    for role in ("worker_first", "worker_meanwhile"):  # the worker's report stands
        assert (items[role].state, items[role].outcome) == (S.COMPLETED, "done")
    assert not CancellationAttempt.objects.filter(item=items["worker_first"]).exists()
    # The remote side said cancelled after the worker said completed: kept for review, not written over.
    assert items["worker_meanwhile"].needs_review
    flipped = Event.objects.get(item=items["flips"], kind="late_result")
    assert (items["flips"].state, items["flips"].needs_review) == (S.CANCELLED, True)
    assert flipped.data["reported"] == S.COMPLETED
    for role in ("cancelled", "cancelled_too", "ignores_cancel", "flips"):
        assert party.counts.count("cancel", items[role].handle) == 1, role


def test_two_batch_cancellers_at_once_process_each_item_once(fast, openai_party, django_capture_on_commit_callbacks):
    party, url = openai_party
    party.configure(latency_s=0.02)
    task = make_task()
    items = [start(task, url) for _ in range(40)]
    dispatched = stop(task, django_capture_on_commit_callbacks)
    results: list[list[Any]] = [[], []]
    barrier = threading.Barrier(2)

    def canceller(n: int) -> None:
        barrier.wait()
        results[n] = items_cancel(item_ids=dispatched, mechanism="openai", concurrency=8)

    threads = [in_thread(lambda n=n: canceller(n)) for n in range(2)]  # type: ignore[misc]
    for thread in threads:
        thread.join()

    handled = [r.item_id for r in results[0]] + [r.item_id for r in results[1]]
    assert sorted(handled) == sorted(dispatched)  # each item by exactly one of them
    for item in items:
        assert CancellationAttempt.objects.filter(item=item).count() == 1
        assert party.counts.count("cancel", item.handle) == 1
        assert Event.objects.filter(item=item, kind="reconciled").count() == 1
        assert _state(item) == S.CANCELLED


@pytest.mark.parametrize("lock", ["FOR UPDATE", "FOR KEY SHARE"])
def test_an_item_whose_row_a_writer_holds_at_the_claim_is_still_cancelled_by_the_batch(
    fast, openai_party, django_capture_on_commit_callbacks, lock
):
    """The claim skips rows other transactions hold rather than wait for them. A writer holding
    one item's row (FOR UPDATE, as a worker writing the item does; FOR KEY SHARE, as inserting an
    event or an attempt for it does) at that moment has not taken the item: the batch must still
    cancel it, not leave it running."""
    party, url = openai_party
    task = make_task()
    items = [start(task, url) for _ in range(30)]
    held = items[7]
    dispatched = stop(task, django_capture_on_commit_callbacks)
    locked, release = threading.Event(), threading.Event()

    def writer() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM stopdesk_workitem WHERE id = %s {lock}", [held.pk])
            locked.set()
            release.wait(10)

    def release_once_the_calls_are_out() -> None:
        # Calls are made only after the claim has committed, so the writer commits after it.
        deadline = time.monotonic() + 10
        while party.counts.count("cancel") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        release.set()

    threads = [in_thread(writer)]
    assert locked.wait(10)
    threads.append(in_thread(release_once_the_calls_are_out))
    results = items_cancel(item_ids=dispatched, mechanism="openai")
    for thread in threads:
        thread.join()

    assert sorted(r.item_id for r in results) == sorted(dispatched)
    for item in items:
        assert _state(item) == S.CANCELLED
        assert party.counts.count("cancel", item.handle) == 1
        assert CancellationAttempt.objects.filter(item=item).count() == 1


def test_the_batch_costs_a_handful_of_statements_whatever_the_item_count(
    fast, openai_party, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    _, url = openai_party
    task = make_task()
    items = [start(task, url) for _ in range(30)]
    dispatched = stop(task, django_capture_on_commit_callbacks)
    # Claim (lock, update), load, attempts, answers, one move, and (after it commits) the one
    # statement that writes the task's settled_at with its event: not ten round trips per item.
    with django_assert_max_num_queries(9):
        results = items_cancel(item_ids=dispatched, mechanism="openai")
    assert {r.state for r in results} == {S.CANCELLED}
    assert Event.objects.filter(item__in=items, kind="reconciled").count() == len(items)


@pytest.fixture
def eager() -> Any:
    import reconcile.tasks  # noqa: F401  (registers the jobs, as a worker's autodiscovery does)
    from stopdesk.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def test_stop_over_many_items_of_one_mechanism_sends_them_to_the_batched_canceller(fast, settings, openai_party, eager):
    # Every call must answer for every item to settle in this one pass: 0.5 s (`fast`) is within
    # reach of a loaded machine's slowest call (32 threads and the stand-in share one process), and
    # a read-back that times out leaves its item running, rightly, with a retry scheduled.
    settings.STOPDESK_MECHANISMS = {"openai": {**settings.STOPDESK_MECHANISMS["openai"], "call_timeout_s": 5.0}}
    party, url = openai_party
    task = make_task()
    many = [start(task, url) for _ in range(BATCH_ABOVE + 10)]
    few = [item_register(task=task, kind=Kind.LOCAL_WORKER, noun="step", actor="test") for _ in range(2)]
    for item in few:
        item_start(item_id=item.pk, actor="test")

    outcome = task_request_stop(task_id=task.pk, actor="user:operator")  # Celery dispatch, eager

    assert len(outcome.dispatched) == len(many) + len(few)
    for item in many:
        assert _state(item) == S.CANCELLED
        assert party.counts.count("cancel", item.handle) == 1
    # One batch records every attempt of its chunk in one INSERT, with one sent_at.
    sent = set(CancellationAttempt.objects.filter(item__in=many).values_list("sent_at", flat=True))
    assert len(sent) == 1
    # Few of a mechanism (here: manual, nothing to ask) still get one job each.
    for item in few:
        assert _state(item) == S.AWAITING_RECONCILIATION
        assert CancellationAttempt.objects.filter(item=item).count() == 1
