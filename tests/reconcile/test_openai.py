"""The stop matrix for OpenAI background responses, against the Responses stand-in."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from reconcile.mechanisms.openai import sandbox as faults
from reconcile.mechanisms.openai.agent import response_create
from reconcile.services.cancel import item_cancel
from stopdesk.models import CancellationAttempt
from stopdesk.services.items import item_register
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.conftest import configure_openai
from tests.reconcile.helpers import events, stop, sweep_until_settled

S = ItemState
pytestmark = pytest.mark.django_db


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    options = settings.STOPDESK_MECHANISMS.get("openai", {}).get("options", {})
    settings.STOPDESK_MECHANISMS = {
        "openai": {
            "options": options,
            "call_timeout_s": 0.5,
            "deadline_s": 20.0,
            "backoff_initial_s": 1.0,
            "backoff_max_s": 4.0,
            "recheck_interval_s": 0.2,
            "recheck_after_cancelled_s": 2.0,
        }
    }


def started(task, url):  # type: ignore[no-untyped-def]
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    # The create gets a roomier timeout than the short one these tests give cancel and retrieve:
    # it is set-up here, and a loaded CI machine once took longer than 0.5 s to answer it.
    response = response_create(
        item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft it", timeout_s=10.0
    )
    item.refresh_from_db()
    assert item.handle == response.id
    return item, response


def test_create_sends_no_retries_and_links_back_to_the_item(fast, openai_party):
    party, url = openai_party
    task = make_task()
    item, response = started(task, url)
    assert item.state == S.RUNNING
    assert party.counts.count("create") == 1
    assert party.get(response.id)["metadata"] == {
        "stopdesk_item": str(item.pk),
        "stopdesk_task": str(task.pk),
        "stopdesk_key": f"stopdesk-item-{item.pk}",
    }
    assert item.submitted_at is not None and item.idempotency_key == f"stopdesk-item-{item.pk}"


def test_a_running_item_cannot_create_after_stop(fast, openai_party, django_capture_on_commit_callbacks):
    from stopdesk.services.errors import TaskStopped
    from stopdesk.services.transitions import item_start

    party, url = openai_party
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    item_start(item_id=item.pk, actor="worker")  # a worker claimed it before Stop
    stop(task, django_capture_on_commit_callbacks)
    with pytest.raises(TaskStopped):
        response_create(item_id=item.pk, actor="worker", base_url=url, model="gpt-test", input="x")
    assert party.counts.count("create") == 0
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.submitted_at is None


def test_a_second_create_for_one_item_is_refused(fast, openai_party):
    from stopdesk.services.errors import IllegalTransition

    party, url = openai_party
    item, _ = started(make_task(), url)
    with pytest.raises(IllegalTransition):
        response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="again")
    assert party.counts.count("create") == 1
    assert "base_url" not in item.detail.get("openai", {})  # where the server calls is configuration


def test_stop_of_a_queued_request_cancels_it_without_a_call(fast, openai_party, django_capture_on_commit_callbacks):
    party, _ = openai_party
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    assert stop(task, django_capture_on_commit_callbacks) == []
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    assert party.stats()["endpoints"] == {}


def test_stop_of_a_running_request_cancels_it_after_read_back(fast, openai_party, django_capture_on_commit_callbacks):
    party, url = openai_party
    task = make_task()
    item, response = started(task, url)
    assert stop(task, django_capture_on_commit_callbacks) == [item.pk]
    result = item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert result.state == item.state == S.CANCELLED
    assert item.outcome == "cancelled; confirmed by read-back"
    assert party.counts.count("cancel", response.id) == 1
    assert party.counts.count("retrieve", response.id) == 1
    attempt = CancellationAttempt.objects.get(item=item)
    assert (attempt.action, attempt.ok, attempt.observed_status) == ("cancel", True, "cancelled")


def test_ignored_cancel_ends_completed_and_says_so(fast, openai_party, django_capture_on_commit_callbacks, clock):
    party, url = openai_party
    party.configure(run_s=0.6)
    party.arm(faults.IGNORE_CANCEL)
    task = make_task()
    item, response = started(task, url)
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.RUNNING and item.next_check_at is not None
    time.sleep(0.8)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert item.outcome == "completed anyway; the cancel did not take effect"
    assert party.counts.count("cancel", response.id) == 1


def test_request_finished_before_stop_is_reconciled_to_its_result(
    fast, openai_party, django_capture_on_commit_callbacks
):
    party, url = openai_party
    party.configure(run_s=0.05)
    task = make_task()
    item, response = started(task, url)
    time.sleep(0.2)
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert item.evidence["detail"]["response_id"] == response.id
    assert item.evidence["detail"]["cancel"] == "HTTP 409; looked it up"


@pytest.mark.parametrize("failure", ["cancel_500", "hang", "refused"])
def test_cancel_failing_for_the_whole_deadline_ends_uncertain(
    failure, fast, openai_party, django_capture_on_commit_callbacks, clock, settings
):
    party, url = openai_party
    task = make_task()
    item, response = started(task, url)
    if failure == "refused":
        configure_openai(settings, base_url="http://127.0.0.1:9/v1")  # nothing listens on port 9
    else:
        party.set_fault(failure, target=response.id)
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.investigate_by is not None
    assert item.investigate_by - clock.now == timedelta(hours=24)
    attempts = CancellationAttempt.objects.filter(item=item)
    assert attempts.count() >= 4  # retried with backoff, not once
    assert all(a.action == "cancel" and a.ok is False for a in attempts)
    if failure != "refused":
        assert party.counts.count("cancel", response.id) == attempts.count()


def test_duplicate_cancel_has_no_second_effect(fast, openai_party, django_capture_on_commit_callbacks, clock):
    party, url = openai_party
    task = make_task()
    item, response = started(task, url)
    stop(task, django_capture_on_commit_callbacks)
    stop(task, django_capture_on_commit_callbacks)  # a second Stop dispatches nothing
    item_cancel(item_id=item.pk)
    item_cancel(item_id=item.pk)  # a duplicated job: the item is claimed or settled
    clock.advance(60)
    sweep_until_settled(clock, item)
    assert party.counts.count("cancel", response.id) == 1
    item.refresh_from_db()
    assert item.state == S.CANCELLED


def test_completed_after_cancelled_is_a_late_result_for_review(
    fast, openai_party, django_capture_on_commit_callbacks, clock
):
    party, url = openai_party
    party.arm(faults.FLIP_TO_COMPLETED)
    task = make_task()
    item, response = started(task, url)
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.next_check_at is not None
    time.sleep(0.3)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.CANCELLED  # never silently overwritten
    assert item.needs_review
    late = events(item, "late_result")
    assert len(late) == 1 and late[0].data["reported"] == S.COMPLETED
    assert party.get(response.id)["status"] == "completed"


def test_create_that_never_answers_leaves_the_item_uncertain(fast, openai_party, django_capture_on_commit_callbacks):
    import openai as sdk

    party, url = openai_party
    party.arm(faults.CREATE_HANG)
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    with pytest.raises(sdk.APITimeoutError):
        response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="x")
    assert party.counts.count("create") == 1  # no SDK retry started a second, unlistable run
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert "cannot be listed" in item.evidence["uncertain_because"]
