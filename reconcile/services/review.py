"""A reviewer's decisions on work items: resolve an uncertain item with evidence, extend its
investigation deadline, escalate it to a named person. Each writes its audit event in the same
transaction; the state change itself goes through `item_transition`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from reconcile.models import Escalation
from stopdesk.models import WorkItem
from stopdesk.services.errors import LedgerError
from stopdesk.services.events import actor_for, event_record
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState

S = ItemState
RESOLVE_PERMISSION = "stopdesk.resolve_workitem"
OUTCOMES = (S.COMPLETED, S.FAILED, S.CANCELLED)


class ReviewRefused(LedgerError):
    code = "review_refused"


def reviewer_check(by: Any) -> None:
    if not by.has_perm(RESOLVE_PERMISSION):
        raise ReviewRefused("This needs the reviewer role.")


def item_resolve(*, item_id: int, outcome: str, note: str, evidence: str, by: Any) -> WorkItem:
    """Settle an uncertain item as completed, failed or cancelled. Evidence is required: a
    resolution is a claim about another system, and the audit must say what it rests on."""
    reviewer_check(by)
    if outcome not in OUTCOMES:
        raise ReviewRefused(f"The outcome must be one of {', '.join(OUTCOMES)}.")
    if not note.strip() or not evidence.strip():
        raise ReviewRefused("A resolution needs a note and evidence.")
    with transaction.atomic():
        item = item_transition(
            item_id=item_id,
            to_state=outcome,
            actor=actor_for(by),
            outcome=note.strip(),
            evidence={
                "resolution": {
                    "by": by.get_username(),
                    "note": note.strip(),
                    "evidence": evidence.strip(),
                    "at": timezone.now().isoformat(),
                }
            },
            kind="resolved",
            message=f"Resolved as {outcome}: {note.strip()}",
            allowed_from=frozenset({S.UNCERTAIN}),
            needs_review=False,
        )
        Escalation.objects.filter(item_id=item_id, closed_at__isnull=True).update(closed_at=timezone.now())
    return item


def item_extend_deadline(*, item_id: int, until: datetime, reason: str, by: Any) -> WorkItem:
    reviewer_check(by)
    if not reason.strip():
        raise ReviewRefused("Say why the deadline moves.")
    if until <= timezone.now():
        raise ReviewRefused("The new deadline must be in the future.")
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if item.state != S.UNCERTAIN:
            raise ReviewRefused(f"Only an uncertain item has an investigation deadline; this one is {item.state}.")
        before = item.investigate_by
        WorkItem.objects.filter(pk=item_id).update(investigate_by=until, updated_at=timezone.now())
        item.refresh_from_db()
        event_record(
            kind="deadline_extended",
            actor=actor_for(by),
            item=item,
            from_state=item.state,
            to_state=item.state,
            message=reason.strip(),
            data={"from": before.isoformat() if before else None, "to": until.isoformat()},
        )
    return item


def item_escalate(*, item_id: int, to: Any, reason: str, by: Any) -> Escalation:
    reviewer_check(by)
    if not reason.strip():
        raise ReviewRefused("Say why it is escalated.")
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        escalation = Escalation.objects.create(item=item, to=to, by=by, reason=reason.strip())
        event_record(
            kind="escalated",
            actor=actor_for(by),
            item=item,
            from_state=item.state,
            to_state=item.state,
            message=f"Escalated to {to.get_username()}: {reason.strip()}",
            data={"escalation": escalation.pk, "to": to.get_username()},
        )
    return escalation


def item_acknowledge_late_result(*, item_id: int, note: str, by: Any) -> WorkItem:
    """A report that contradicted a recorded outcome (a response that completed after it was
    recorded cancelled, a worker reporting after Stop) was kept as an event and flagged. The
    recorded state does not change: terminal states never do. The reviewer says what they found
    and what follows (for example a compensation on the record), and the flag is cleared."""
    reviewer_check(by)
    if not note.strip():
        raise ReviewRefused("Say what you found and what follows from it.")
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if not item.needs_review or item.state == S.UNCERTAIN:
            raise ReviewRefused("This item has no late result waiting for review.")
        WorkItem.objects.filter(pk=item_id).update(needs_review=False, updated_at=timezone.now())
        event_record(
            kind="late_result_acknowledged",
            actor=actor_for(by),
            item=item,
            from_state=item.state,
            to_state=item.state,
            message=note.strip(),
            data={"late_result": item.evidence.get("late_result", {})},
        )
    item.refresh_from_db()
    return item
