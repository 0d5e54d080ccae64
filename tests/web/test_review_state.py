"""One definition of "needs review", read the same by the task list's tag and filter, the count
above the list, the task page and the summary; and the task page closing the loop on what people
decided (a record archived by its compensation, a late report acknowledged, an item resolved)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.services.compensation import (
    compensation_approve,
    compensation_escalate,
    compensation_execute,
    compensation_propose,
    compensation_reject,
)
from reconcile.services.records import records_accept_as_is
from reconcile.services.review import item_acknowledge_late_result, item_resolve
from stopdesk.models import Task
from stopdesk.review_state import tasks_needing_review, tasks_needing_review_count
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.states import CompensationState, ItemState, Kind
from stopdesk.summary import REVIEW, task_summary
from stopdesk.views.selectors import task_overview, tasks_flag, tasks_listing
from tests.factories import ACTOR, make_external_effect, make_item, make_task
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect, proposal, settle

pytestmark = pytest.mark.django_db
S = ItemState
C = CompensationState


@dataclass(frozen=True)
class Spec:
    """One item of a generated ledger, and what people did about it."""

    state: str  # recorded state (completed items may carry a record)
    late: bool  # a contradicting report arrived after the outcome was recorded
    acknowledged: bool  # ... and a reviewer acknowledged it
    record: bool | None  # None: no record; else whether the record is reversible
    compensation: str | None  # what became of a proposed reversal

    def needs_review(self, stopped: bool) -> bool:
        """The definition, written out again as the oracle."""
        if self.state == S.UNCERTAIN:
            return True
        if self.late and not self.acknowledged:
            return True
        completed = self.state == S.COMPLETED or (self.late and self.state == S.CANCELLED)
        # Rejected leaves the record as if nothing had been proposed; proposed and escalated wait.
        return bool(self.record and stopped and completed and self.compensation not in (C.APPROVED, C.RUNNING, C.DONE))


@st.composite
def specs(draw) -> Spec:  # type: ignore[no-untyped-def]
    state = draw(st.sampled_from([S.QUEUED, S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED, S.UNCERTAIN]))
    late = state == S.CANCELLED and draw(st.booleans())
    record = draw(st.one_of(st.none(), st.booleans())) if state == S.COMPLETED else None
    compensation = draw(st.sampled_from([None, C.PROPOSED, C.ESCALATED, C.REJECTED])) if record else None
    return Spec(state, late, late and draw(st.booleans()), record, compensation)


def _build(ledger: list[Spec], stopped: bool, roles) -> Task:  # type: ignore[no-untyped-def]
    task = make_task("Generated")
    items = []
    for spec in ledger:
        if spec.record is not None:
            item = make_external_effect(task, reversible=spec.record, system="crm")
        elif spec.late:
            item = make_item(task, state=S.RUNNING, noun="reply")
            settle(item.pk, S.CANCELLED)
        else:
            item = make_item(task, state=spec.state, kind=Kind.LOCAL_WORKER, noun="export")
        items.append((item, spec))
    if stopped:
        task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    for item, spec in items:
        if spec.compensation:
            c = compensation_propose(record_id=item.external_records.get().pk, action="archive", by=roles["reviewer"])
            if spec.compensation == C.ESCALATED:
                compensation_escalate(compensation_id=c.pk, by=roles["reviewer"], to=roles["approver"], reason="Ask")
            elif spec.compensation == C.REJECTED:
                compensation_reject(compensation_id=c.pk, by=roles["approver"], reason="Keep it")
        if spec.late:
            item_finish(item_id=item.pk, succeeded=True, actor="test:late")  # it ran after all
            if spec.acknowledged:
                item_acknowledge_late_result(item_id=item.pk, note="Checked; it is fine.", by=roles["reviewer"])
    task.refresh_from_db()
    return task


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledger=st.lists(specs(), min_size=1, max_size=5), stopped=st.booleans())
def test_the_tag_the_filter_the_count_the_page_and_the_summary_agree_on_needs_review(roles, ledger, stopped):
    # A proposal needs a stopped task; a ledger with one is stopped whatever was drawn.
    stopped = stopped or any(s.compensation for s in ledger)
    task = _build(ledger, stopped, roles)
    expected = sum(spec.needs_review(stopped) for spec in ledger)
    mine = Task.objects.filter(pk=task.pk)

    (row,) = list(mine)
    tasks_flag([row])
    overview = task_overview(task)
    summary = task_summary(task)
    told = sum(_count(sentence) for sentence in summary.split(". ") if REVIEW in sentence)

    assert row.review_count == expected, summary  # the tag on the list
    assert tasks_listing(mine, status="review").exists() == bool(expected)  # the filter
    assert tasks_needing_review(mine).exists() == bool(expected)
    assert tasks_needing_review_count(mine, 10) == int(bool(expected))  # the count above the list
    assert overview.review.count == expected  # the task page
    assert told == expected, summary  # the summary's "review required" names the same items


def _count(sentence: str) -> int:
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    first = sentence.split()[0].lower()
    return words.index(first) if first in words else int(first)


# The loop closes, through the real services and the sandbox CRM.


def test_a_record_archived_by_its_compensation_no_longer_asks_for_review(as_user, roles, crm):
    record = crm_effect(system_url("crm"))
    task = Task.objects.get(pk=record.item.task_id)
    # Sent before Stop, answered after it: Stop met it in flight.
    assert task_summary(task) == "Stopped new work. One record created; review required."
    c = proposal(record, roles["reviewer"])
    compensation_approve(compensation_id=c.pk, by=roles["approver"], reauthenticated_at=timezone.now())
    compensation_execute(compensation_id=c.pk)
    c.refresh_from_db()
    assert c.state == C.DONE

    assert task_summary(task) == (f"Stopped new work. One record created, then archived by compensation #{c.pk}.")
    page = as_user("reviewer").get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Nothing needs a person now" in page
    assert f'archived by\n        <a href="/compensations/{c.pk}/">compensation #{c.pk}</a>' in page
    listing = as_user("operator").get(reverse("task-list")).content.decode()
    assert "need review" not in listing and "No task needs review." in listing


def test_a_record_accepted_as_it_is_no_longer_asks_for_review(roles, crm):
    record = crm_effect(system_url("crm"))
    task = Task.objects.get(pk=record.item.task_id)
    assert tasks_needing_review(Task.objects.all()).filter(pk=task.pk).exists()
    records_accept_as_is(record_ids=[record.pk], by=roles["reviewer"], note="The customer asked for it.")
    assert not tasks_needing_review(Task.objects.all()).filter(pk=task.pk).exists()
    assert "review required" not in task_summary(task)
    assert task_overview(task).review.count == 0


def test_an_acknowledged_late_report_is_told_as_reviewed(roles):
    task = make_task()
    reply = make_item(task, state=S.RUNNING, noun="reply")
    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    task.refresh_from_db()
    settle(reply.pk, S.CANCELLED)
    item_finish(item_id=reply.pk, succeeded=True, actor="test:late")
    assert task_summary(task) == (
        "Stopped new work. One reply completed; a late report contradicts its record: review required."
    )
    item_acknowledge_late_result(item_id=reply.pk, note="The reply went out; harmless.", by=roles["reviewer"])
    assert task_summary(task) == (
        "Stopped new work. One reply completed; a late report contradicted its record, reviewed."
    )
    assert task_overview(task).review.count == 0 and task_overview(task).review.acknowledged == 1


def test_an_operator_sees_the_count_and_the_review_state_without_a_dead_end(as_user, roles):
    task = make_task("Refund run")
    for _ in range(3):
        make_item(task, state=S.UNCERTAIN, noun="refund", kind=Kind.EXTERNAL_OPERATION)
    done = make_item(task, state=S.UNCERTAIN, noun="refund", kind=Kind.EXTERNAL_OPERATION)
    item_resolve(item_id=done.pk, outcome=S.COMPLETED, note="Paid", evidence="PSP shows it paid", by=roles["reviewer"])
    make_task("Quiet run")
    operator = as_user("operator")

    listing = operator.get(reverse("task-list")).content.decode()
    assert "1 task needs review" in listing and "3 items need review" in listing
    filtered = operator.get(reverse("task-list"), {"status": "review"}).content.decode()
    assert "Refund run" in filtered and "Quiet run" not in filtered

    page = operator.get(reverse("task-detail", args=[task.pk])).content.decode()
    assert "Needs a person: 3 items" in page
    assert "3 with unknown outcome" in page and "1 item with unknown outcome resolved by a reviewer" in page
    assert "Reviewers decide these in the review queue" in page
    assert reverse("review-queue") not in page.split("<main", 1)[1]  # no link into a 403
    # Every link on the operator's page opens for the operator.
    uncertain = operator.get(reverse("task-items", args=[task.pk]), {"state": "uncertain"})
    assert uncertain.status_code == 200
