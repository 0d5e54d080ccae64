"""The stop matrix for generic HTTP operations, against the sandbox CRM and mail outbox."""

from __future__ import annotations

import time

import pytest

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.agent import http_submit
from reconcile.services.cancel import item_cancel
from reconcile.services.reconcile import item_reconcile
from stopdesk.models import CancellationAttempt, ExternalRecord
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_register
from stopdesk.states import ItemState, Kind
from tests.factories import make_external_effect, make_task
from tests.reconcile.conftest import configure_system
from tests.reconcile.helpers import events, stop, sweep_until_settled

S = ItemState
pytestmark = pytest.mark.django_db


@pytest.fixture
def fast(settings):  # type: ignore[no-untyped-def]
    options = settings.STOPDESK_MECHANISMS.get("http", {}).get("options", {})
    settings.STOPDESK_MECHANISMS = {
        "http": {
            "call_timeout_s": 0.5,
            "deadline_s": 20.0,
            "backoff_initial_s": 1.0,
            "backoff_max_s": 4.0,
            "recheck_interval_s": 0.5,
            "recheck_after_cancelled_s": 5.0,
            "options": options,
        }
    }


def crm_declaration(base: str) -> dict:
    """An item names its system; the party fixture configured where it is (`base`)."""
    return {"system": "crm", "effect": "created"}


def outbox_declaration(base: str) -> dict:
    return {"system": "outbox", "effect": "sent"}


def registered(task, noun="record"):  # type: ignore[no-untyped-def]
    return item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun=noun, actor="test", mechanism="http")


def create_record(item, base, key="key-1", timeout_s=None):  # type: ignore[no-untyped-def]
    return http_submit(
        item_id=item.pk,
        actor="test",
        idempotency_key=key,
        url=base + "/records",
        json={"name": "ACME"},
        declaration=crm_declaration(base),
        timeout_s=timeout_s,
    )


def send_mail(item, base, key="mail-1", timeout_s=None):  # type: ignore[no-untyped-def]
    return http_submit(
        item_id=item.pk,
        actor="test",
        idempotency_key=key,
        url=base + "/messages",
        json={"to": "a@example.test", "subject": "Invoice"},
        declaration=outbox_declaration(base),
        timeout_s=timeout_s,
    )


def test_accepted_action_records_the_record_id_and_version(fast, crm_party):
    _party, base = crm_party
    item = registered(make_task())
    submitted = create_record(item, base)
    assert submitted.accepted
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    record = ExternalRecord.objects.get(item=item)
    assert (record.system, record.record_id, record.version, record.reversal) == ("crm", "crm-1", "1", "archive")


def test_queued_action_is_cancelled_by_stop_and_never_sent(fast, crm_party, django_capture_on_commit_callbacks):
    party, base = crm_party
    task = make_task()
    item = registered(task)
    assert stop(task, django_capture_on_commit_callbacks) == []
    with pytest.raises(TaskStopped):
        create_record(item, base)
    item.refresh_from_db()
    assert item.state == S.CANCELLED
    assert party.counts.count("create") == 0


def test_stop_after_acceptance_reconciles_to_the_actual_record(fast, crm_party, django_capture_on_commit_callbacks):
    party, base = crm_party
    party.set_fault("hang_after_commit", target="key-1")
    task = make_task()
    item = registered(task)
    submitted = create_record(item, base, timeout_s=0.3)
    assert not submitted.accepted and submitted.error == "ReadTimeout"
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION
    assert stop(task, django_capture_on_commit_callbacks) == [item.pk]
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    record = ExternalRecord.objects.get(item=item)
    assert (record.record_id, record.version) == ("crm-1", "1")
    assert party.counts.count("create", "key-1") == 1


def test_action_that_landed_despite_stop_ends_completed_and_says_so(
    fast, outbox_party, django_capture_on_commit_callbacks
):
    party, base = outbox_party
    party.set_fault("fail_500_after_commit", target="mail-1")
    task = make_task()
    item = registered(task, noun="email")
    assert send_mail(item, base).error == "HTTP 500"
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert item.outcome == "completed anyway; the cancel did not take effect"
    assert ExternalRecord.objects.get(item=item).effect == "sent"
    assert party.sent_count("mail-1") == 1


@pytest.mark.parametrize("failure", ["read_500", "refused"])
def test_lookup_failing_for_the_whole_deadline_ends_uncertain(
    failure, fast, crm_party, django_capture_on_commit_callbacks, clock, settings
):
    party, base = crm_party
    party.set_fault("fail_500", target="key-1")
    task = make_task()
    item = registered(task)
    create_record(item, base)
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION
    if failure == "refused":
        configure_system(settings, "crm", lookup_url="http://127.0.0.1:9/records?idempotency_key={idempotency_key}")
    else:
        party.set_fault("read_500", target="key-1")
    stop(task, django_capture_on_commit_callbacks)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert CancellationAttempt.objects.filter(item=item, ok=False).count() >= 4


def test_declared_cancel_endpoint_failing_retries_then_uncertain(
    fast, crm_party, django_capture_on_commit_callbacks, clock, settings
):
    party, base = crm_party
    party.set_fault("fail_500", target="key-1")
    task = make_task()
    item = registered(task)
    create_record(item, base)
    item.refresh_from_db()
    configure_system(settings, "crm", cancel_url="http://127.0.0.1:9/ops/{idempotency_key}/cancel")
    stop(task, django_capture_on_commit_callbacks)
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    attempts = CancellationAttempt.objects.filter(item=item)
    assert attempts.count() >= 4 and {a.action for a in attempts} == {"cancel"}


def test_duplicate_reconciliation_sends_nothing_twice(fast, crm_party, django_capture_on_commit_callbacks, clock):
    party, base = crm_party
    party.set_fault("hang_after_commit", target="key-1")
    task = make_task()
    item = registered(task)
    create_record(item, base, timeout_s=0.3)
    stop(task, django_capture_on_commit_callbacks)
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item_cancel(item_id=item.pk)
    sweep_until_settled(clock, item)
    assert party.counts.count("create", "key-1") == 1
    assert len(party.records()) == 1
    assert ExternalRecord.objects.filter(item=item).count() == 1


def test_mail_that_lands_after_it_was_reconciled_cancelled_is_a_late_result(
    fast, outbox_party, django_capture_on_commit_callbacks, clock
):
    party, base = outbox_party
    party.configure(accept_delay_s=1.0)
    task = make_task()
    item = registered(task, noun="email")
    assert send_mail(item, base, timeout_s=0.2).error == "ReadTimeout"
    stop(task, django_capture_on_commit_callbacks)
    clock.advance(2)  # past our own call timeout: a 404 now means "not received"
    item_reconcile(item_id=item.pk, now=clock.now)
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.next_check_at is not None
    time.sleep(1.2)  # the outbox finishes the send its client gave up on
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.needs_review
    assert [e.data["reported"] for e in events(item, "late_result")] == [S.COMPLETED]
    assert party.sent_count("mail-1") == 1


def test_reversal_runs_only_against_the_version_it_expects(fast, crm_party):
    party, base = crm_party
    item = registered(make_task())
    create_record(item, base)
    record = ExternalRecord.objects.get(item=item)
    http = registry.get("http")
    assert http.read_version(record).version == "1"
    party.edit(record.record_id, actor="someone else", name="ACME Ltd")
    seen = http.read_version(record)
    assert (seen.ok, seen.version, seen.status) == (True, "2", "active")
    mismatch = http.reverse(record, "1")
    assert (mismatch.outcome, mismatch.current_version) == ("version_mismatch", "2")
    assert party.get(record.record_id)["status"] == "active"
    done = http.reverse(record, "2")
    assert done.done and done.new_version == "3"
    assert party.get(record.record_id)["status"] == "archived"
    assert http.reverse(record, "2").done  # a retried reversal is a replay, not a second effect


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_stop_that_settles_the_action_while_the_agent_still_waits_does_not_break_the_agent(fast, crm_party):
    """The agent's call hangs after the CRM applied it; Stop's reconciliation finds the record by
    its key and completes the item; when the agent's call times out, the finding stands."""
    import threading

    from django.db import connections

    from reconcile.mechanisms.http import sandbox as crm_faults

    party, base = crm_party
    party.set_fault(crm_faults.HANG_AFTER_COMMIT)
    task = make_task()
    item = registered(task)
    outcome: dict = {}

    def agent() -> None:
        try:
            outcome["submitted"] = create_record(item, base, key="key-race", timeout_s=3.0)
        except Exception as exc:  # what the agent would see
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=agent)
    thread.start()
    deadline = time.monotonic() + 5
    while not party.records() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert party.records(), "the CRM never applied the write"
    from stopdesk.services.stop import task_request_stop

    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    thread.join(timeout=10)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["submitted"].accepted is False
    item.refresh_from_db()
    assert item.state == S.COMPLETED and ExternalRecord.objects.filter(item=item).count() == 1


def _system(base: str, if_match: str) -> dict:
    """A system declared once in settings, the way STOPDESK_CRM_URL configures the CRM."""
    return {
        "base_url": base,
        "record_url": "/records/{record_id}",
        "reverse": {"action": "archive", "url": "/records/{record_id}/archive", "if_match": if_match},
    }


@pytest.mark.parametrize(("if_match", "outcome"), [('"v{version}"', "done"), ('"rev-{version}"', "version_mismatch")])
def test_a_system_declared_in_settings_reverses_with_its_own_if_match_spelling(settings, crm_party, if_match, outcome):
    """No declaration on the item: relative URLs join the system's base_url, and the version goes
    back in If-Match as the system spells it (the sandbox CRM reads `"v1"`, not `"rev-1"`)."""
    party, base = crm_party
    settings.STOPDESK_MECHANISMS = {"http": {"options": {"systems": {"crm": _system(base, if_match)}}}}
    party.seed("crm-9", name="ACME Ltd")
    item = make_external_effect(make_task(), system="crm")
    record = ExternalRecord.objects.get(item=item)
    ExternalRecord.objects.filter(pk=record.pk).update(record_id="crm-9")
    record.refresh_from_db()
    http = registry.get("http")
    assert http.read_version(record).version == "1"
    assert http.reverse(record, "1").outcome == outcome
    assert party.get("crm-9")["status"] == ("archived" if outcome == "done" else "active")
