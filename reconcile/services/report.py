"""A person's report on work that has no status lookup (the manual mechanism, and any adapter that
cannot inspect): after Stop such an item waits for its result to be reported and turns uncertain
at the mechanism's deadline. A reviewer who already knows what happened reports it before then,
with evidence, instead of waiting for the item to land in the review queue."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import Capability, ItemRef
from reconcile.services.review import ReviewRefused
from stopdesk.models import WorkItem
from stopdesk.services.events import actor_for
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState

S = ItemState
RESOLVE_PERMISSION = "stopdesk.resolve_workitem"
# Where a report can come before the deadline: waiting for it after Stop, or still running with
# its cancel requested (Stop asked; the reconciler has not looked yet).
REPORTABLE_FROM = frozenset({S.AWAITING_RECONCILIATION, S.RUNNING})


def waits_for_report(item: WorkItem) -> bool:
    """Its mechanism cannot look the result up: only a report settles it before the deadline."""
    if not registry.known(item.mechanism):
        return False
    return not registry.get(item.mechanism).can(Capability.INSPECT, ItemRef.of(item))


def item_reportable(item: WorkItem) -> bool:
    if item.state not in REPORTABLE_FROM or not waits_for_report(item):
        return False
    return item.state == S.AWAITING_RECONCILIATION or item.cancel_requested_at is not None


def report_deadline(item: WorkItem) -> datetime | None:
    """When the item turns uncertain if nothing is reported: the mechanism's deadline counted
    from when reconciliation began (the cancel request, or the first check), as the engine
    counts it."""
    if not item_reportable(item):
        return None
    since = item.cancel_requested_at
    if since is None:
        started = (item.evidence.get("reconcile") or {}).get("since")
        since = datetime.fromisoformat(started) if started else None
    if since is None:
        return item.next_check_at
    return since + timedelta(seconds=registry.get(item.mechanism).settings.deadline_s)


def item_report(*, item_id: int, done: bool, note: str, evidence: str, by: Any) -> WorkItem:
    """Settle a reportable item: done is completed; not done is cancelled when Stop asked for it
    (it did not happen), failed otherwise. Evidence is required, as for a resolution: the report
    is a claim about the world outside, and the audit must say what it rests on."""
    if not by.has_perm(RESOLVE_PERMISSION):
        raise ReviewRefused("This needs the reviewer role.")
    if not evidence.strip():
        raise ReviewRefused("A report needs evidence: a link, a record id, what the other side said.")
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if not item_reportable(item):
            raise ReviewRefused(
                f"Only work waiting for its result after Stop can be reported here; this {item.noun} is "
                f"{item.get_state_display().lower()}."
            )
        if done:
            to_state, outcome = S.COMPLETED, "reported done"
        elif item.cancel_requested_at is not None:
            to_state, outcome = S.CANCELLED, "reported not done"
        else:
            to_state, outcome = S.FAILED, "reported not done"
        words = f"{outcome}: {note.strip()}" if note.strip() else outcome
        return item_transition(
            item_id=item.pk,
            to_state=to_state,
            actor=actor_for(by),
            outcome=words[:200],
            evidence={
                "report": {
                    "by": by.get_username(),
                    "done": done,
                    "note": note.strip(),
                    "evidence": evidence.strip(),
                    "at": timezone.now().isoformat(),
                }
            },
            kind="reported",
            message=f"Reported {'done' if done else 'not done'} before its deadline: {note.strip() or evidence.strip()}",
            allowed_from=REPORTABLE_FROM,
            next_check_at=None,
        )
