"""The picture of a stop: each child as a bar from its start to its outcome, coloured by its
latest known outcome, with the moment Stop was requested as a vertical line.

What matters at Stop comes first: the items that had crossed the boundary and were still in
flight when Stop came (what Stop had to cancel or reconcile), then an even sample of the rest.
A bar ends at the item's outcome as the system learnt it; an item a person resolved later ends
where it became uncertain, not at the click (its colour is still the resolved outcome). Each bar
is its own row: the name is HTML text that stays legible at any width and the bar a thin SVG
stretched across its track, drawn by the server (templates/tasks/timeline.html). No
JavaScript, and a fixed number of rows of fixed height for the same items, so a poll never moves
the page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, Value, When, Window
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, RowNumber
from django.db.models.lookups import GreaterThan, LessThan
from django.utils import timezone

from stopdesk.models import Event, Task, WorkItem
from stopdesk.states import ItemState
from stopdesk.summary import latest_outcome

S = ItemState
LIMIT = 60  # bars drawn; a task with more says which ones it drew
WIDTH = 1000  # a track's SVG units
UNSETTLED = (S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION)
FIELDS = (
    "id",
    "noun",
    "label",
    "state",
    "reported",
    "created_at",
    "started_at",
    "submitted_at",
    "finished_at",
    "updated_at",
    "resolved_at",
)


@dataclass(frozen=True)
class Bar:
    item_id: int
    label: str
    outcome: str
    x: float
    w: float
    crossed: bool  # started (or submitted) before Stop and still in flight at Stop
    started: bool
    open: bool  # no outcome yet: the bar runs to now
    title: str


@dataclass(frozen=True)
class Tick:
    x: int  # percent of the track
    label: str


@dataclass(frozen=True)
class Timeline:
    in_flight: list[Bar]  # in flight when Stop came, all of them up to LIMIT
    sample: list[Bar]  # an even sample of the others
    total: int
    crossed: int  # in flight when Stop came, all of them
    stop_x: float | None
    stop_at: datetime | None
    ticks: list[Tick]
    width: int

    @property
    def bars(self) -> list[Bar]:
        return self.in_flight + self.sample

    @property
    def others(self) -> int:
        return self.total - self.crossed

    @property
    def left_out(self) -> int:
        return self.total - len(self.bars)


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def _span_label(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _in_flight_at(stop_at: datetime) -> Q:
    """Begun before Stop and without an outcome at Stop. The outcome of an item that went
    uncertain is the moment it did (finished_at is when a person resolved it, later)."""
    went_uncertain_before = Event.objects.filter(item=OuterRef("pk"), to_state=S.UNCERTAIN, at__lte=stop_at)
    went_uncertain = Q(state=S.UNCERTAIN) | Q(evidence__has_key="resolution")
    begun = LessThan(Coalesce("started_at", "submitted_at"), Value(stop_at))
    ended_after = Q(state__in=UNSETTLED) | Q(GreaterThan(Coalesce("finished_at", "updated_at"), Value(stop_at)))
    return Q(begun) & ended_after & ~(went_uncertain & Q(Exists(went_uncertain_before)))


def _rows(task: Task, total: int, stop_at: datetime | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(in flight at Stop, a sample of the rest, how many were in flight): three queries."""
    items: QuerySet[WorkItem] = WorkItem.objects.filter(task=task).annotate(
        reported=KT("evidence__late_result__reported"),
        resolved_at=KT("evidence__resolution__at"),
    )
    first: list[dict[str, Any]] = []
    crossed = 0
    if stop_at:
        items = items.annotate(at_stop=Case(When(_in_flight_at(stop_at), then=Value(True)), default=Value(False)))
        in_flight = items.filter(at_stop=True)
        crossed = in_flight.count()
        first = list(in_flight.order_by(Coalesce("started_at", "submitted_at").asc(), "id").values(*FIELDS)[:LIMIT])
        items = items.filter(at_stop=False)
    room = LIMIT - len(first)
    if room <= 0:
        return first, [], crossed
    rest = total - crossed
    ranked = items.annotate(rank=Window(RowNumber(), order_by=[F("created_at").asc(), F("id").asc()]))
    # Evenly spread over the rest, first to last, exactly `room` of them when there are more.
    picks = sorted({1 + (i * rest) // room for i in range(room)}) if rest > room else list(range(1, rest + 1))
    sample = list(ranked.filter(rank__in=picks).order_by("rank").values(*FIELDS))
    return first, sample, crossed


def task_timeline(task: Task, *, total: int, now: datetime | None = None) -> Timeline | None:
    if total == 0:
        return None
    now = now or timezone.now()
    stop_at = task.stop_requested_at
    first, sample, crossed = _rows(task, total, stop_at)
    rows = first + sample
    # When an item that a person resolved had gone uncertain: its outcome as the system knew it.
    settled_ids = [r["id"] for r in rows if r["state"] == S.UNCERTAIN or r["resolved_at"]]
    uncertain_at: dict[int, datetime] = {}
    for item_id, at in (
        Event.objects.filter(item_id__in=settled_ids, to_state=S.UNCERTAIN).order_by("at").values_list("item_id", "at")
    ):
        uncertain_at.setdefault(item_id, at)
    spans = []
    for r in rows:
        start = r["started_at"] or r["created_at"]
        if r["state"] in UNSETTLED:
            end, is_open = now, True
        else:
            end, is_open = uncertain_at.get(r["id"]) or r["finished_at"] or r["updated_at"], False
        spans.append((r, start, max(end, start), is_open))
    t0 = min([task.created_at, *(s for _, s, _, _ in spans)])
    t1 = max([*(e for _, _, e, _ in spans), *([stop_at] if stop_at else [])])
    if any(is_open for *_, is_open in spans):
        t1 = max(t1, now)
    span = max(_seconds(t0, t1), 1.0)
    scale = WIDTH / span

    def x_of(t: datetime) -> float:
        return round(_seconds(t0, t) * scale, 1)

    def bar(r: dict[str, Any], start: datetime, end: datetime, is_open: bool) -> Bar:
        outcome = latest_outcome(r["state"], r["reported"])
        begun = r["started_at"] or r["submitted_at"]
        in_flight = bool(stop_at and begun and begun < stop_at and (is_open or end > stop_at))
        x = x_of(start)
        w = max(round(x_of(end) - x, 1), 4.0)  # an instant still shows
        name = r["label"] or r["noun"]
        took = _span_label(_seconds(start, end))
        title = f"{name} #{r['id']}: {S(outcome).label.lower()}" + (
            ", still open" if is_open else f" after {took}" if begun else ", never started"
        )
        if r["resolved_at"]:
            title += f"; its outcome was unknown until a reviewer resolved it at {str(r['resolved_at'])[11:19]}"
        if in_flight:
            title += "; crossed the boundary before Stop and was in flight when it came"
        return Bar(
            item_id=r["id"],
            label=f"{r['noun'][:18]} #{r['id']}",
            outcome=outcome,
            x=x,
            w=w,
            crossed=in_flight,
            started=bool(begun),
            open=is_open,
            title=title,
        )

    bars = [bar(*span_) for span_ in spans]
    ticks = [Tick(x=round(f * 100), label=_span_label(span * f)) for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    ticks[0] = Tick(x=0, label="0")
    return Timeline(
        in_flight=bars[: len(first)],
        sample=bars[len(first) :],
        total=total,
        crossed=crossed,
        stop_x=x_of(stop_at) if stop_at else None,
        stop_at=stop_at,
        ticks=ticks,
        width=WIDTH,
    )
