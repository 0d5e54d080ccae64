"""A task's review state as everyone who can see the task may read it: how many of its items need
a person and why (the one definition, stopdesk.review_state), and what people have decided so far
(reversals, acknowledged late reports, resolved items). Operators read it here; reviewers act on
it in the queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Q
from django.db.models.fields.json import KT

from reconcile.models import Compensation
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.review_state import needs_review, reversal_pending
from stopdesk.states import CompensationState, ItemState
from stopdesk.summary import past_tense

S = ItemState
C = CompensationState
DECISIONS_SHOWN = 10


@dataclass(frozen=True)
class Decision:
    """What became of one record's reversal, as the task page tells it before the
    compensation's number: "crm acme-1: archived by compensation #2"."""

    compensation: Compensation
    text: str

    @classmethod
    def of(cls, c: Compensation) -> Decision:
        action = c.action.replace("_", " ")
        texts: dict[str, str] = {
            C.DONE: f"{past_tense(c.action)} by",
            C.PROPOSED: f"a reversal ({action}) waits for approval:",
            C.ESCALATED: f"a reversal ({action}) is escalated:",
            C.REJECTED: f"a reversal ({action}) was rejected:",
            C.FAILED: f"a reversal ({action}) failed:",
        }
        return cls(c, texts.get(c.state, f"a reversal ({action}) is under way:"))


@dataclass
class TaskReview:
    count: int  # items that need a person
    uncertain: int
    flagged: int  # a late report or a shared record nobody acknowledged yet
    reversals: int  # reversible records of completed work waiting for a reversal decision
    resolved: int  # uncertain items a person resolved
    acknowledged: int  # late reports a person acknowledged
    decisions: list[Decision] = field(default_factory=list)
    compensations_total: int = 0

    @property
    def decided(self) -> bool:
        return bool(self.resolved or self.acknowledged or self.compensations_total)

    @property
    def compensations_more(self) -> int:
        return self.compensations_total - len(self.decisions)


def task_review(task: Task) -> TaskReview:
    """Two queries, whatever the number of items (three past ten compensations)."""
    reported = KT("evidence__late_result__reported")
    pending = ExternalRecord.objects.filter(reversal_pending(), item__task=task).values("item_id")
    counts = (
        WorkItem.objects.filter(task=task)
        .annotate(reported=reported)
        .aggregate(
            count=Count("id", filter=needs_review(task=task)),
            uncertain=Count("id", filter=Q(state=S.UNCERTAIN)),
            flagged=Count("id", filter=Q(needs_review=True) & ~Q(state=S.UNCERTAIN)),
            resolved=Count("id", filter=Q(evidence__has_key="resolution")),
            acknowledged=Count("id", filter=Q(reported__isnull=False, needs_review=False)),
            reversals=Count("id", filter=Q(pk__in=pending)),
        )
    )
    compensations = (
        Compensation.objects.filter(external_record__item__task=task).select_related("external_record").order_by("-id")
    )
    shown = list(compensations[:DECISIONS_SHOWN])
    total = len(shown) if len(shown) < DECISIONS_SHOWN else compensations.count()
    decisions = [Decision.of(c) for c in shown]
    return TaskReview(decisions=decisions, compensations_total=total, **counts)
