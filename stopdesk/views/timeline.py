"""The picture of a stop: each child as a bar from its start to its outcome, coloured by its
latest known outcome, with the moment Stop was requested as a vertical line. Geometry is computed
here and drawn as server-rendered SVG (templates/tasks/timeline.svg.html): no JavaScript, and
the same size for the same items, so a poll never moves the page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models.fields.json import KT
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.states import ItemState
from stopdesk.summary import latest_outcome

S = ItemState
LIMIT = 60  # bars drawn; a task with more says how many it left out
WIDTH = 1000
LABEL_W = 170  # the names column
RIGHT = 12
ROW_H = 14
BAR_H = 9
TOP = 22  # room for the Stop label
AXIS_H = 24
UNSETTLED = (S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION)


@dataclass(frozen=True)
class Bar:
    item_id: int
    label: str
    outcome: str
    x: float
    y: float
    w: float
    crossed: bool  # started (or submitted) before Stop and still in flight at Stop
    started: bool
    open: bool  # no outcome yet: the bar runs to now
    title: str

    @property
    def text_y(self) -> float:
        return self.y + BAR_H - 1

    @property
    def mid_y(self) -> float:
        return self.y + BAR_H / 2


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    bars: list[Bar]
    total: int
    crossed: int
    stop_x: float | None
    stop_at: datetime | None
    ticks: list[Tick]
    width: int
    height: int
    chart_left: int
    chart_right: int

    @property
    def left_out(self) -> int:
        return self.total - len(self.bars)

    @property
    def axis_y(self) -> int:
        return self.height - AXIS_H + 4

    @property
    def bottom(self) -> int:
        return self.height - AXIS_H

    @property
    def tick_label_y(self) -> int:
        return self.height - 6


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def _span_label(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def task_timeline(task: Task, *, total: int, now: datetime | None = None) -> Timeline | None:
    if total == 0:
        return None
    now = now or timezone.now()
    rows = list(
        WorkItem.objects.filter(task=task)
        .annotate(reported=KT("evidence__late_result__reported"))
        .order_by("id")
        .values(
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
        )[:LIMIT]
    )
    stop_at = task.stop_requested_at
    spans = []
    for r in rows:
        start = r["started_at"] or r["created_at"]
        if r["state"] in UNSETTLED:
            end, is_open = now, True
        else:
            end, is_open = r["finished_at"] or r["updated_at"], False
        spans.append((r, start, max(end, start), is_open))
    t0 = min([task.created_at, *(s for _, s, _, _ in spans)])
    t1 = max([*(e for _, _, e, _ in spans), *([stop_at] if stop_at else [])])
    if any(is_open for *_, is_open in spans):
        t1 = max(t1, now)
    span = max(_seconds(t0, t1), 1.0)
    left, right = LABEL_W, WIDTH - RIGHT
    scale = (right - left) / span

    def x_of(t: datetime) -> float:
        return round(left + _seconds(t0, t) * scale, 1)

    bars = []
    for i, (r, start, end, is_open) in enumerate(spans):
        outcome = latest_outcome(r["state"], r["reported"])
        begun = r["started_at"] or r["submitted_at"]
        # Crossed the boundary before Stop and still in flight when it came: what Stop had to
        # cancel through a mechanism or reconcile, rather than simply keep from starting.
        crossed = bool(stop_at and begun and begun < stop_at and (is_open or end > stop_at))
        x = x_of(start)
        w = max(round(x_of(end) - x, 1), 4.0)  # an instant still shows
        name = r["label"] or r["noun"]
        label = f"{r['noun'][:18]} #{r['id']}"  # the full name is in the bar's tooltip
        took = _span_label(_seconds(start, end))
        title = f"{name} #{r['id']}: {S(outcome).label.lower()}" + (
            ", still open" if is_open else f" after {took}" if begun else ", never started"
        )
        if crossed:
            title += "; crossed the boundary before Stop and was in flight when it came"
        bars.append(
            Bar(
                item_id=r["id"],
                label=label,
                outcome=outcome,
                x=x,
                y=TOP + i * ROW_H,
                w=w,
                crossed=crossed,
                started=bool(begun),
                open=is_open,
                title=title,
            )
        )
    height = TOP + len(bars) * ROW_H + AXIS_H
    ticks = [Tick(x=round(left + f * (right - left), 1), label=_span_label(span * f)) for f in (0.25, 0.5, 0.75, 1.0)]
    ticks.insert(0, Tick(x=left, label="0"))
    return Timeline(
        bars=bars,
        total=total,
        crossed=sum(b.crossed for b in bars),
        stop_x=x_of(stop_at) if stop_at else None,
        stop_at=stop_at,
        ticks=ticks,
        width=WIDTH,
        height=height,
        chart_left=left,
        chart_right=right,
    )
