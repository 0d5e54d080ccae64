"""The review queue's uncertain items for a bad day: grouped by what they have in common (task,
system, tool, the reason they are uncertain) with counts, narrowed by a filter, a search and
"mine". Two queries whatever the number of items or groups: one aggregate for the groups, one
window for the first rows of the groups on the page."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

from django.db.models import Case, Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, TextField, Value, When, Window
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, NullIf, RowNumber
from django.utils import timezone

from reconcile.models import Escalation
from stopdesk.models import WorkItem
from stopdesk.states import ItemState

S = ItemState
GROUP_ROWS = 10  # rows shown per group; "all N in this group" reaches the rest
GROUPS_PER_PAGE = 12
GROUP_BY = {
    "all": ("task", "system", "tool", "error"),
    "task": ("task",),
    "system": ("system",),
    "tool": ("tool",),
    "error": ("error",),
}
GROUP_BY_LABELS = {"all": "Task, system, tool and reason", **{k: k.capitalize() for k in GROUP_BY if k != "all"}}
GROUP_BY_LABELS["error"] = "Reason"

# What an item has in common with others, from what its runtime recorded. The system: the HTTP
# operation's declared system, else the MCP server's name, else the mechanism. The tool: the
# framework tool's or MCP tool's name, else what a person calls the item.
SYSTEM = Coalesce(
    NullIf(KT("detail__http__system"), Value("")),
    NullIf(KT("detail__server_name"), Value("")),
    F("mechanism"),
    output_field=TextField(),
)
TOOL = Coalesce(
    NullIf(
        Case(
            When(detail__tool__name__isnull=False, then=KT("detail__tool__name")),
            default=KT("detail__tool"),
            output_field=TextField(),
        ),
        Value(""),
    ),
    F("noun"),
    output_field=TextField(),
)
ERROR = Coalesce(
    NullIf(KT("evidence__uncertain_because"), Value("")),
    NullIf(F("outcome"), Value("")),
    Value("No reason recorded"),
    output_field=TextField(),
)
KEYS: dict[str, Any] = {"task": F("task_id"), "system": SYSTEM, "tool": TOOL, "error": ERROR}


@dataclass(frozen=True)
class QueueFilter:
    """What the reviewer narrowed the uncertain items to, read from and written to the query."""

    q: str = ""
    task: int | None = None
    system: str = ""
    tool: str = ""
    error: str = ""
    mine: bool = False
    overdue: bool = False
    group_by: str = "all"
    page: int = 1

    @classmethod
    def from_query(cls, data: Mapping[str, Any]) -> QueueFilter:
        task = str(data.get("task", "")).strip()
        group_by = str(data.get("group_by", "all"))
        try:
            page = max(1, int(data.get("gpage", 1)))
        except (TypeError, ValueError):
            page = 1
        return cls(
            q=str(data.get("q", "")).strip()[:200],
            task=int(task) if task.isdigit() else None,
            system=str(data.get("system", ""))[:200],
            tool=str(data.get("tool", ""))[:200],
            error=str(data.get("error", ""))[:2000],
            mine=data.get("mine") in ("1", "on", "true"),
            overdue=data.get("overdue") in ("1", "on", "true"),
            group_by=group_by if group_by in GROUP_BY else "all",
            page=page,
        )

    def params(self, **changes: Any) -> dict[str, str]:
        f = replace(self, **changes)
        values = {
            "q": f.q,
            "task": str(f.task) if f.task else "",
            "system": f.system,
            "tool": f.tool,
            "error": f.error,
            "mine": "1" if f.mine else "",
            "overdue": "1" if f.overdue else "",
            "group_by": "" if f.group_by == "all" else f.group_by,
            "gpage": "" if f.page == 1 else str(f.page),
        }
        return {k: v for k, v in values.items() if v}

    def query(self, **changes: Any) -> str:
        return urlencode(self.params(**changes))

    @property
    def key_params(self) -> dict[str, str]:
        """The part of the filter that narrows to one group."""
        return {k: v for k, v in self.params().items() if k in ("task", "system", "tool", "error")}

    @property
    def unkeyed_query(self) -> str:
        return self.query(task=None, system="", tool="", error="", page=1)

    @property
    def narrowed(self) -> bool:
        return bool(self.q or self.task or self.system or self.tool or self.error or self.mine or self.overdue)


@dataclass
class ItemGroup:
    key: dict[str, Any]
    count: int
    overdue: int
    first_deadline: Any
    task_title: str
    filter: QueueFilter
    rows: list[WorkItem] = field(default_factory=list)

    @property
    def slug(self) -> str:
        """A stable id for the group's elements (the key can be long free text)."""
        raw = "\x1f".join(f"{k}={self.key[k]}" for k in sorted(self.key))
        return hashlib.blake2s(raw.encode(), digest_size=6).hexdigest()

    @property
    def more(self) -> int:
        return self.count - len(self.rows)

    @property
    def title(self) -> str:
        parts = [str(self.key[k]) for k in ("tool",) if k in self.key]
        if "system" in self.key:
            parts.append(f"in {self.key['system']}")
        if "task" in self.key and not parts:
            parts.append(self.task_title)
        if not parts and "error" in self.key:
            parts.append(str(self.key["error"]))
        return " ".join(parts)


@dataclass
class GroupedQueue:
    filter: QueueFilter
    groups: list[ItemGroup]
    total: int
    group_count: int
    page: int

    @property
    def has_next(self) -> bool:
        return self.page * GROUPS_PER_PAGE < self.group_count

    @property
    def has_previous(self) -> bool:
        return self.page > 1

    @property
    def next_query(self) -> str:
        return self.filter.query(page=self.page + 1)

    @property
    def previous_query(self) -> str:
        return self.filter.query(page=self.page - 1)


def uncertain_items(f: QueueFilter, user: Any) -> QuerySet[WorkItem]:
    """The uncertain items the filter selects, with their group keys annotated."""
    items = WorkItem.objects.filter(state=S.UNCERTAIN).annotate(
        g_system=SYSTEM, g_tool=TOOL, g_error=ERROR, g_task=F("task_id")
    )
    if f.task:
        items = items.filter(task_id=f.task)
    if f.system:
        items = items.filter(g_system=f.system)
    if f.tool:
        items = items.filter(g_tool=f.tool)
    if f.error:
        items = items.filter(g_error=f.error)
    if f.overdue:
        items = items.filter(investigate_by__lt=timezone.now())
    if f.mine:
        items = items.filter(mine_q(user))
    if f.q:
        q = f.q
        match = (
            Q(label__icontains=q)
            | Q(noun__icontains=q)
            | Q(handle__icontains=q)
            | Q(idempotency_key__icontains=q)
            | Q(outcome__icontains=q)
            | Q(task__title__icontains=q)
            | Q(g_tool__icontains=q)
            | Q(g_system__icontains=q)
            | Q(g_error__icontains=q)
        )
        if q.lstrip("#").isdigit():
            match |= Q(pk=int(q.lstrip("#")))
        items = items.filter(match)
    return items


def mine_q(user: Any) -> Q:
    """Mine: items of tasks I own or stopped, and items escalated to me and still open."""
    escalated = Escalation.objects.filter(item=OuterRef("pk"), to=user, closed_at__isnull=True)
    return Q(task__owner=user) | Q(task__stop_request__requested_by=user) | Q(Exists(escalated))


def group_filter(f: QueueFilter, key: Mapping[str, Any]) -> QueueFilter:
    """The filter that selects exactly one group: the current filter narrowed to its key."""
    return replace(
        f,
        task=key.get("task", f.task),
        system=key.get("system", f.system),
        tool=key.get("tool", f.tool),
        error=key.get("error", f.error),
        page=1,
    )


def grouped_queue(f: QueueFilter, user: Any) -> GroupedQueue:
    names = GROUP_BY[f.group_by]
    items = uncertain_items(f, user)
    now = timezone.now()
    aggregate = (
        items.values(*(f"g_{n}" for n in names))
        .annotate(
            n=Count("id"),
            overdue=Count("id", filter=Q(investigate_by__lt=now)),
            first_deadline=Min("investigate_by"),
            task_title=Max("task__title"),
        )
        # Biggest groups first: clearing them empties the queue fastest; then the most urgent.
        .order_by("-n", F("first_deadline").asc(nulls_last=True))
    )
    found = list(aggregate)
    group_count = len(found)
    pages = max(1, -(-group_count // GROUPS_PER_PAGE))
    page = min(f.page, pages)
    shown = found[(page - 1) * GROUPS_PER_PAGE : page * GROUPS_PER_PAGE]
    groups = []
    for row in shown:
        key = {n: row[f"g_{n}"] for n in names}
        groups.append(
            ItemGroup(
                key=key,
                count=row["n"],
                overdue=row["overdue"],
                first_deadline=row["first_deadline"],
                task_title=row["task_title"] or "",
                filter=group_filter(f, key),
            )
        )
    if groups:
        _fill_rows(groups, items, names)
    return GroupedQueue(f, groups, sum(r["n"] for r in found), group_count, page)


def _fill_rows(groups: list[ItemGroup], items: QuerySet[WorkItem], names: tuple[str, ...]) -> None:
    # One query for the first rows of every group on the page: a window numbers the rows within
    # each group, overdue first, and only the groups shown are asked for.
    wanted = Q()
    for group in groups:
        wanted |= Q(**{f"g_{n}": group.key[n] for n in names})
    ranked = (
        items.filter(wanted)
        .annotate(
            rank=Window(
                RowNumber(),
                partition_by=[KEYS[n] for n in names],
                order_by=[F("investigate_by").asc(nulls_last=True), F("id").asc()],
            )
        )
        .filter(rank__lte=GROUP_ROWS)
        .select_related("task")
    )
    by_key: dict[tuple[Any, ...], list[WorkItem]] = {}
    for item in ranked.order_by(F("investigate_by").asc(nulls_last=True), "id"):
        by_key.setdefault(tuple(getattr(item, f"g_{n}") for n in names), []).append(item)
    for group in groups:
        group.rows = by_key.get(tuple(group.key[n] for n in names), [])


def selected_ids(f: QueueFilter, user: Any, limit: int) -> list[int]:
    """The ids of every uncertain item the filter selects (a whole group, across its pages), up
    to `limit` + 1 so a caller can tell the selection was too big."""
    return list(uncertain_items(f, user).order_by("id").values_list("id", flat=True)[: limit + 1])
