"""A reviewer's decisions on many items at once: resolve, extend, escalate, acknowledge. One note
for the lot, one transaction, and still one audited event per item with that item's own evidence.

Each decision is a conditional write: only items still in the state the reviewer saw are
changed (the from-state is in the statement's WHERE). Items another person or the reconciler
moved meanwhile are returned as `moved`, never overwritten."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from reconcile.models import Escalation
from reconcile.services.review import OUTCOMES, ReviewRefused, reviewer_check
from stopdesk.models import WorkItem
from stopdesk.services.events import actor_for
from stopdesk.services.transitions import Row, items_move
from stopdesk.states import ItemState

S = ItemState
# One decision covers at most this many items: a bad day's group, with room to spare.
MAX_ITEMS = 1000
MAX_HOURS = 24 * 14


@dataclass
class Decided:
    """What a decision did: the items it changed and those that had moved meanwhile."""

    action: str
    done: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    batch: str = ""


def _ids(item_ids: Sequence[int]) -> list[int]:
    ids = sorted({int(i) for i in item_ids})
    if not ids:
        raise ReviewRefused("Select at least one item.")
    if len(ids) > MAX_ITEMS:
        raise ReviewRefused(f"Decide at most {MAX_ITEMS} items at once.")
    return ids


def _note(note: str, missing: str) -> str:
    note = note.strip()
    if not note:
        raise ReviewRefused(missing)
    return note


def _facts(item: WorkItem) -> dict[str, Any]:
    """The item's own facts kept with its decision, so each event stands on its own."""
    return {"handle": item.handle, "idempotency_key": item.idempotency_key, "outcome_before": item.outcome}


def _locked(ids: list[int], where: Q) -> list[WorkItem]:
    # Locked in id order, as every set-based writer here takes rows, so two decisions on
    # overlapping selections queue rather than deadlock.
    return list(WorkItem.objects.select_for_update().filter(where, pk__in=ids).order_by("pk"))


def items_resolve(*, item_ids: Sequence[int], outcome: str, note: str, evidence: str, by: Any) -> Decided:
    """Settle uncertain items as completed, failed or cancelled, each with the evidence."""
    reviewer_check(by)
    ids = _ids(item_ids)
    if outcome not in OUTCOMES:
        raise ReviewRefused(f"The outcome must be one of {', '.join(OUTCOMES)}.")
    note = _note(note, "A resolution needs a note and evidence.")
    evidence = _note(evidence, "A resolution needs a note and evidence.")
    batch, at = uuid.uuid4().hex, timezone.now().isoformat()
    with transaction.atomic():
        items = _locked(ids, Q(state=S.UNCERTAIN))
        rows = {}
        for item in items:
            resolution = {
                "by": by.get_username(),
                "note": note,
                "evidence": evidence,
                "at": at,
                "batch": batch,
                **_facts(item),
            }
            rows[item.pk] = Row(evidence={"resolution": resolution}, data={"evidence": {"resolution": resolution}})
        done = items_move(
            where=Q(pk__in=list(rows)),
            from_states=(S.UNCERTAIN,),
            to_state=outcome,
            actor=actor_for(by),
            kind="resolved",
            message=f"Resolved as {outcome}: {note}",
            sets={"outcome": note[:200], "needs_review": False},
            rows=rows,
            return_ids=True,
        )
        assert isinstance(done, list)
        Escalation.objects.filter(item_id__in=done, closed_at__isnull=True).update(closed_at=timezone.now())
    return Decided("resolve", sorted(done), _rest(ids, done), batch)


def items_extend(*, item_ids: Sequence[int], hours: int, reason: str, by: Any) -> Decided:
    """Move each uncertain item's investigate-by deadline `hours` on from where it stands (or from
    now, if it has passed)."""
    reviewer_check(by)
    ids = _ids(item_ids)
    if not 1 <= hours <= MAX_HOURS:
        raise ReviewRefused(f"Extend by 1 to {MAX_HOURS} hours.")
    reason = _note(reason, "Say why the deadline moves.")
    batch, now = uuid.uuid4().hex, timezone.now()
    with transaction.atomic():
        rows = {}
        for item in _locked(ids, Q(state=S.UNCERTAIN)):
            until = max(item.investigate_by or now, now) + timedelta(hours=hours)
            before = item.investigate_by.isoformat() if item.investigate_by else None
            rows[item.pk] = Row(
                sets={"investigate_by": until},
                data={"from": before, "to": until.isoformat(), "batch": batch, **_facts(item)},
            )
        done = items_move(
            where=Q(pk__in=list(rows)),
            from_states=(S.UNCERTAIN,),
            to_state=None,
            actor=actor_for(by),
            kind="deadline_extended",
            message=reason,
            rows=rows,
            return_ids=True,
        )
        assert isinstance(done, list)
    return Decided("extend", sorted(done), _rest(ids, done), batch)


def items_escalate(*, item_ids: Sequence[int], to: Any, reason: str, by: Any) -> Decided:
    """Hand uncertain items to a named person: one escalation per item, each with its event."""
    reviewer_check(by)
    ids = _ids(item_ids)
    reason = _note(reason, "Say why it is escalated.")
    if to is None or to.pk == by.pk:
        raise ReviewRefused("Choose another person to escalate to.")
    batch = uuid.uuid4().hex
    with transaction.atomic():
        items = _locked(ids, Q(state=S.UNCERTAIN))
        escalations = Escalation.objects.bulk_create(
            [Escalation(item=item, to=to, by=by, reason=reason) for item in items]
        )
        rows = {
            e.item_id: Row(
                data={"escalation": e.pk, "to": to.get_username(), "batch": batch, **_facts(item)},
            )
            for item, e in zip(items, escalations, strict=True)
            if e.item_id is not None
        }
        done = items_move(
            where=Q(pk__in=list(rows)),
            from_states=(S.UNCERTAIN,),
            to_state=None,
            actor=actor_for(by),
            kind="escalated",
            message=f"Escalated to {to.get_username()}: {reason}",
            rows=rows,
            return_ids=True,
        )
        assert isinstance(done, list)
    return Decided("escalate", sorted(done), _rest(ids, done), batch)


def items_acknowledge(*, item_ids: Sequence[int], note: str, by: Any) -> Decided:
    """Clear the review flag of settled items whose late report contradicted their outcome; their
    recorded state does not change (terminal states never do). Each event keeps its late report."""
    reviewer_check(by)
    ids = _ids(item_ids)
    note = _note(note, "Say what you found and what follows from it.")
    batch = uuid.uuid4().hex
    waiting = Q(needs_review=True) & ~Q(state=S.UNCERTAIN)
    with transaction.atomic():
        items = _locked(ids, waiting)
        rows = {
            item.pk: Row(data={"late_result": item.evidence.get("late_result", {}), "batch": batch, **_facts(item)})
            for item in items
        }
        states = tuple(sorted({item.state for item in items})) or (S.COMPLETED,)
        done = items_move(
            where=Q(pk__in=list(rows)) & waiting,
            from_states=states,
            to_state=None,
            actor=actor_for(by),
            kind="late_result_acknowledged",
            message=note,
            sets={"needs_review": False},
            rows=rows,
            return_ids=True,
        )
        assert isinstance(done, list)
    return Decided("acknowledge", sorted(done), _rest(ids, done), batch)


def _rest(ids: list[int], done: list[int]) -> list[int]:
    changed = set(done)
    return [i for i in ids if i not in changed]
