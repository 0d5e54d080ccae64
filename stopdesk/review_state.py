"""What "needs review" means: the one definition the task list's tag and filter, the task page's
count and the summary's "review required" all read, so they cannot disagree.

An item needs a person when any of these holds:

- it is **uncertain** (no one knows its outcome);
- it is **flagged** (`needs_review`): a late report contradicted its recorded outcome, or two
  items of one runtime recorded the same external record, and nobody has acknowledged it yet;
- its latest outcome is completed and it left a **reversible record** on a stopped task with no
  reversal decided: no compensation, or only a rejected or failed one, or one that still waits
  for an approver (proposed or escalated). An approved, running or done compensation closes it,
  and so does a reviewer accepting the record as it is.

A record that was reversed stays in the account ("One record created, then archived by
compensation #2."), but it no longer asks for review.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet

from reconcile.models import Compensation, RecordDecision, RecordDecisionKind
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.states import CompensationState, ItemState

S = ItemState
C = CompensationState
# A person decided the record's reversal and the decision is being, or has been, carried out.
REVERSAL_DECIDED = (C.APPROVED, C.RUNNING, C.DONE)
# A compensation that still waits for a person.
REVERSAL_WAITING = (C.PROPOSED, C.ESCALATED)


def reversal_pending(prefix: str = "") -> Q:
    """For ExternalRecord rows (reached through `prefix`, e.g. "external_records__"): a
    reversible effect of completed work on a stopped task with no reversal decided."""
    decided = Compensation.objects.filter(external_record=OuterRef(f"{prefix}pk"), state__in=REVERSAL_DECIDED)
    accepted = RecordDecision.objects.filter(external_record=OuterRef(f"{prefix}pk"), kind=RecordDecisionKind.ACCEPTED)
    completed = Q(**{f"{prefix}item__state": S.COMPLETED}) | Q(
        **{f"{prefix}item__evidence__late_result__reported": S.COMPLETED}
    )
    return Q(**{f"{prefix}reversible": True, f"{prefix}item__task__stop_requested_at__isnull": False}) & Q(
        completed, ~Exists(decided), ~Exists(accepted)
    )


def needs_review(prefix: str = "", *, task: Task | None = None) -> Q:
    """For WorkItem rows (reached through `prefix`, e.g. "item__"): the item needs a person.

    Given the task the rows belong to, the pending records are read once for that task (a hashed
    list of item ids) instead of probed once per item: the task page counts 10,000 items this way."""
    flagged = Q(**{f"{prefix}state": S.UNCERTAIN}) | Q(**{f"{prefix}needs_review": True})
    if task is not None:
        pending = ExternalRecord.objects.filter(reversal_pending(), item__task=task).values("item_id")
        return flagged | Q(**{f"{prefix}pk__in": pending})
    records = ExternalRecord.objects.filter(reversal_pending(), item=OuterRef(f"{prefix}pk"))
    return flagged | Q(Exists(records))


def tasks_needing_review(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Tasks with at least one item that needs a person, found from the few rows that need one
    (uncertain and flagged items have partial indexes; pending reversals are records of stopped
    tasks) rather than by reading every task's items."""
    flagged = WorkItem.objects.filter(Q(state=S.UNCERTAIN) | Q(needs_review=True)).values("task_id")
    pending = ExternalRecord.objects.filter(reversal_pending()).values("item__task_id")
    return tasks.filter(Q(pk__in=flagged) | Q(pk__in=pending))


def tasks_needing_review_count(tasks: QuerySet[Task], cap: int) -> int:
    """How many of `tasks` need review, at most cap + 1."""
    return tasks_needing_review(tasks).order_by()[: cap + 1].count()
