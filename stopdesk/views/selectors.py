"""Reads for the pages. Each page runs a fixed number of queries whatever the number of items:
aggregates for counts, and a bounded window of rows per group or section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Prefetch, Q, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from reconcile.models import Compensation, Escalation, RecordDecision, RecordDecisionKind
from stopdesk.models import CancellationAttempt, ExternalRecord, StopRequest, Task, WorkItem
from stopdesk.paging import QUEUE_CAP, capped, capped_count
from stopdesk.review_state import needs_review, tasks_needing_review, tasks_needing_review_count
from stopdesk.states import UNSETTLED, CompensationState, ItemState
from stopdesk.summary import task_summary
from stopdesk.views.task_review import TaskReview, task_review
from stopdesk.views.timeline import task_timeline

S = ItemState
C = CompensationState
# Groups on the task page, in the order a person needs them: what wants attention first.
GROUP_ORDER = (S.UNCERTAIN, S.AWAITING_RECONCILIATION, S.RUNNING, S.QUEUED, S.FAILED, S.COMPLETED, S.CANCELLED)
GROUP_LIMIT = 20
SECTION_LIMIT = 25

TASK_STATUSES = {
    "running": "Running",
    "stopping": "Stopping",
    "stopped": "Stopped",
    "finished": "Finished",
    "review": "Needs review",
}


def tasks_listing(tasks: QuerySet[Task], *, status: str = "", q: str = "") -> QuerySet[Task]:
    """Newest first. The flags each row shows are read for the page only (`tasks_flag`): in the
    select list over the whole table, PostgreSQL hashes every unsettled item of every task."""
    if q:
        match = Q(title__icontains=q)
        if q.isdigit():
            match |= Q(pk=int(q))
        tasks = tasks.filter(match)
    # Filters, not annotations: in the WHERE clause an EXISTS is probed per task, newest first,
    # until the page is full.
    stopped = Q(stop_requested_at__isnull=False)
    unsettled = Exists(WorkItem.objects.filter(task=OuterRef("pk"), state__in=UNSETTLED))
    # Running until closed: a task whose items have all settled may get new work (services/closing.py).
    closed = Q(closed_at__isnull=False)
    filters = {
        "running": ~stopped & (Q(unsettled) | ~closed),
        "stopping": stopped & Q(unsettled),
        "stopped": stopped & ~Q(unsettled),
        "finished": ~stopped & ~Q(unsettled) & closed,
    }
    if status in filters:
        tasks = tasks.filter(filters[status])
    elif status == "review":
        tasks = tasks_needing_review(tasks)
    return tasks.select_related("owner", "runtime").order_by("-created_at", "-id")


def tasks_review_count(tasks: QuerySet[Task]) -> int:
    """How many tasks need review: exact up to the queue's cap, "1,000+" beyond it."""
    return capped(tasks_needing_review_count(tasks, QUEUE_CAP), QUEUE_CAP)


def tasks_flag(tasks: list[Task]) -> None:
    """Set has_unsettled, review_count and status on one page of tasks: one query, one index
    probe per task for the flag and one count of the items that need a person (the same
    definition as the "Needs review" filter and the summary's "review required")."""
    unsettled = WorkItem.objects.filter(task=OuterRef("pk"), state__in=UNSETTLED)
    review = (
        WorkItem.objects.filter(needs_review(), task=OuterRef("pk"))
        .order_by()
        .values("task")
        .annotate(n=Count("id"))
        .values("n")
    )
    page = Task.objects.filter(pk__in=[t.pk for t in tasks])
    flagged = page.annotate(has_unsettled=Exists(unsettled), review_count=Subquery(review))
    flags = {pk: (a, b or 0) for pk, a, b in flagged.values_list("pk", "has_unsettled", "review_count")}
    for task in tasks:
        task.has_unsettled, task.review_count = flags[task.pk]  # type: ignore[attr-defined]
        task.status = task_status(task)  # type: ignore[attr-defined]


def task_status(task: Any) -> str:
    if task.stop_requested_at:
        return "stopping" if task.has_unsettled else "stopped"
    return "finished" if task.closed_at is not None and not task.has_unsettled else "running"


@dataclass
class Group:
    state: str
    label: str
    count: int
    items: list[WorkItem] = field(default_factory=list)

    @property
    def more(self) -> int:
        return self.count - len(self.items)


@dataclass
class TaskOverview:
    task: Task
    summary: str
    groups: list[Group]
    total: int
    unsettled: int
    stop_request: StopRequest | None

    timeline: Any = None
    review: TaskReview | None = None

    @property
    def settled(self) -> bool:
        """Nothing left moving. A task with no items yet is not settled unless it was stopped:
        its agent may still register work, and the page keeps watching for it. Settled is not
        over: an open task can get new work at any moment (see `closed`)."""
        return self.unsettled == 0 and (self.total > 0 or self.task.stop_requested_at is not None)

    @property
    def closed(self) -> bool:
        """The runtime said the task is over, or it stayed idle past the timeout: it takes no new
        work (stopdesk.services.closing)."""
        return self.task.closed_at is not None

    @property
    def over(self) -> bool:
        """Closed, with nothing left unsettled: nothing can start or change any more. Only then
        does the page stop refreshing (a stopped task keeps refreshing until it closes, so a late
        result shows up live)."""
        return self.closed and self.unsettled == 0

    @property
    def stop_offered(self) -> bool:
        """Stop is offered whenever work can still start: until a stop is recorded, unless the
        task is closed with nothing left moving."""
        return self.stop_request is None and not (self.closed and self.unsettled == 0)

    @property
    def finished(self) -> bool:
        """Closed without a Stop, every item at its outcome: nothing can start, nothing to stop."""
        return self.over and self.task.stop_requested_at is None

    @property
    def status(self) -> str:
        if self.task.stop_requested_at:
            return "stopping" if self.unsettled else "stopped"
        return "finished" if self.finished else "running"


def items_with_trail(items: QuerySet[WorkItem]) -> QuerySet[WorkItem]:
    return items.prefetch_related(
        Prefetch("external_records", queryset=ExternalRecord.objects.order_by("id")),
        Prefetch("attempts", queryset=CancellationAttempt.objects.order_by("sent_at", "id")),
    )


def task_overview(task: Task, *, with_items: bool = True) -> TaskOverview:
    counts = dict(WorkItem.objects.filter(task=task).values_list("state").annotate(n=Count("id")).order_by())
    groups = [Group(s, S(s).label, counts[s]) for s in GROUP_ORDER if counts.get(s)]
    if with_items and groups:
        # One query for the first rows of every group: a window numbers the rows per state.
        ranked = (
            WorkItem.objects.filter(task=task)
            .annotate(rank=Window(RowNumber(), partition_by=[F("state")], order_by=[F("id").asc()]))
            .filter(rank__lte=GROUP_LIMIT)
        )
        by_state: dict[str, list[WorkItem]] = {}
        for item in items_with_trail(ranked.order_by("state", "id")):
            by_state.setdefault(item.state, []).append(item)
        for group in groups:
            group.items = by_state.get(group.state, [])
    stop_request = StopRequest.objects.select_related("requested_by").filter(task=task).first()
    total = sum(counts.values())
    return TaskOverview(
        task=task,
        summary=task_summary(task),
        groups=groups,
        total=total,
        unsettled=sum(counts.get(s, 0) for s in UNSETTLED),
        stop_request=stop_request,
        timeline=task_timeline(task, total=total) if with_items else None,
        review=task_review(task) if with_items else None,
    )


# The review queue.


@dataclass
class Section:
    key: str
    rows: list[Any]
    count: int
    page: int

    @property
    def has_next(self) -> bool:
        return self.page * SECTION_LIMIT < self.count

    @property
    def has_previous(self) -> bool:
        return self.page > 1


def task_gateway_facts(task: Task) -> dict[str, str] | None:
    """For a task whose calls came through the MCP gateway (a client's session): the revision the
    client spoke and the upstream, with the revision and transport used there, as its latest call
    recorded them. None for any other task."""
    item = WorkItem.objects.filter(task=task, detail__has_key="gateway").order_by("-pk").only("detail").first()
    if item is None:
        return None
    gateway, mcp = item.detail.get("gateway") or {}, item.detail.get("mcp") or {}
    return {
        "client_revision": str(gateway.get("client_revision") or ""),
        "upstream": str(gateway.get("upstream") or ""),
        "revision": str(mcp.get("revision") or ""),
        "transport": str(mcp.get("transport") or "").replace("_", " "),
    }


def _section(key: str, queryset: QuerySet[Any], page: int) -> Section:
    # Exact up to the cap, "1,000+" beyond it: the queue's counts must not grow with history.
    count = capped_count(queryset, QUEUE_CAP)
    pages = max(1, -(-count // SECTION_LIMIT))
    page = min(max(1, page), pages)
    start = (page - 1) * SECTION_LIMIT
    return Section(key, list(queryset[start : start + SECTION_LIMIT]), count, page)


def queue_uncertain() -> QuerySet[WorkItem]:
    # Overdue first: the earliest deadline is the most overdue one.
    return (
        WorkItem.objects.filter(state=S.UNCERTAIN)
        .select_related("task")
        .order_by(F("investigate_by").asc(nulls_last=True), "id")
    )


def queue_reversals() -> QuerySet[ExternalRecord]:
    """Completed effects of stopped tasks that may need reversal, with no compensation under way
    or done and not accepted as they are: those completed after Stop, and those completed before
    it that a reviewer put on the list."""
    flagged = RecordDecision.objects.filter(external_record=OuterRef("pk"), kind=RecordDecisionKind.FLAGGED)
    return (
        _effects_of_stopped_tasks()
        .filter(~_before_stop() | Q(Exists(flagged)))
        .select_related("item__task")
        .order_by("-recorded_at", "-id")
    )


def queue_before_stop() -> QuerySet[ExternalRecord]:
    """Effects completed before their task was stopped, nobody has decided about yet: not
    reversal candidates unless a reviewer puts them on the list."""
    decided = RecordDecision.objects.filter(external_record=OuterRef("pk"))
    return (
        _effects_of_stopped_tasks()
        .filter(_before_stop())
        .exclude(Exists(decided))
        .select_related("item__task")
        .order_by("-recorded_at", "-id")
    )


def _effects_of_stopped_tasks() -> QuerySet[ExternalRecord]:
    active = Compensation.objects.filter(external_record=OuterRef("pk")).exclude(state__in=(C.REJECTED, C.FAILED))
    accepted = RecordDecision.objects.filter(external_record=OuterRef("pk"), kind=RecordDecisionKind.ACCEPTED)
    return (
        ExternalRecord.objects.filter(item__state=S.COMPLETED, item__task__stop_requested_at__isnull=False)
        .exclude(Exists(active))
        .exclude(Exists(accepted))
    )


def _before_stop() -> Q:
    """The item reached its outcome before Stop was requested (when the record was recorded, for
    an item with no finish time)."""
    return Q(item__finished_at__lt=F("item__task__stop_requested_at")) | Q(
        item__finished_at__isnull=True, recorded_at__lt=F("item__task__stop_requested_at")
    )


def queue_proposals() -> QuerySet[Compensation]:
    return (
        Compensation.objects.filter(state=C.PROPOSED)
        .select_related("external_record__item__task", "proposed_by")
        .order_by("proposed_at", "id")
    )


def queue_escalations() -> QuerySet[Escalation]:
    return (
        Escalation.objects.filter(closed_at__isnull=True, item__isnull=False)
        .select_related("item__task", "to", "by")
        .order_by("at", "id")
    )


def queue_escalated_compensations() -> QuerySet[Compensation]:
    return (
        Compensation.objects.filter(state=C.ESCALATED)
        .select_related("external_record__item__task", "proposed_by", "escalated_to")
        .order_by("decided_at", "id")
    )


def queue_late_results() -> QuerySet[WorkItem]:
    """Settled items a contradicting report arrived for after their outcome was recorded."""
    return (
        WorkItem.objects.filter(needs_review=True)
        .exclude(state=S.UNCERTAIN)
        .select_related("task")
        .order_by("updated_at", "id")
    )


SECTIONS = {
    "uncertain": queue_uncertain,
    "late": queue_late_results,
    "reversals": queue_reversals,
    "before_stop": queue_before_stop,
    "proposals": queue_proposals,
    "escalations": queue_escalations,
    "escalated": queue_escalated_compensations,
}


def review_queue(pages: dict[str, int], only: str | None = None) -> dict[str, Section]:
    keys = [only] if only else list(SECTIONS)
    return {key: _section(key, SECTIONS[key](), pages.get(key, 1)) for key in keys}


def now() -> Any:
    return timezone.now()
