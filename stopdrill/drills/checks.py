"""After a drill: inspect the ledger and the external systems, and say what went wrong.

Three invariants, each checked from both sides where it can be:

1. **Nothing after the boundary.** In the ledger, no item started or submitted at or after the
   task's stop_requested_at. At the external systems, every action that arrived after the stop
   belongs to an item that passed the boundary before it (its request was already on the wire).
2. **Nothing lost.** Every item is settled (completed, failed, cancelled, or uncertain with an
   investigate-by deadline), and every effect found at an external system belongs to an item whose
   record admits it: completed, uncertain, or flagged for review by a late result. An effect the
   ledger calls cancelled or failed, or an effect no item claims, is lost.
3. **The audit is complete.** Each item's events, replayed in order, lead from registration to its
   recorded state without a gap; one stop request, and one event per duplicate stop; every
   cancellation attempt closed with an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stopdesk.models import CancellationAttempt, Event, StopRequest, Task, WorkItem
from stopdesk.services.sql import read_snapshot
from stopdesk.states import SETTLED, ItemState
from stopdrill.drills.core import DrillContext

S = ItemState
# What an OpenAI response's status means at the end of a drill: did it (or may it still) produce output?
_OPENAI_EFFECT = {"completed": True, "queued": True, "in_progress": True}
# The database clock and this process's clock are the same machine's; allow for rounding only.
CLOCK_SLACK_S = 0.05


@dataclass
class ItemReport:
    id: int
    mechanism: str
    noun: str
    state: str
    needs_review: bool
    investigate_by: str | None
    path: list[str]
    key: str = ""
    parent: int | None = None

    @property
    def label(self) -> str:
        return f"{self.state}, review" if self.needs_review and self.state != S.UNCERTAIN else self.state

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "label": self.label}


@dataclass
class Inspection:
    items: list[ItemReport] = field(default_factory=list)
    after_boundary: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    audit: list[str] = field(default_factory=list)
    external_actions: int = 0

    @property
    def violations(self) -> list[str]:
        return [*self.after_boundary, *self.lost, *self.audit]


def inspect_drill(ctx: DrillContext) -> Inspection:
    assert ctx.task is not None
    task = ctx.task
    ledger = _read_ledger(task)
    items, events = ledger.items, ledger.events
    stop_at = task.stop_requested_at
    out = Inspection()
    by_id = {i.pk: i for i in items}
    by_key = {i.idempotency_key: i for i in items if i.idempotency_key}

    for item in items:
        out.items.append(
            ItemReport(
                id=item.pk,
                mechanism=item.mechanism,
                noun=item.noun,
                state=item.state,
                needs_review=item.needs_review,
                investigate_by=item.investigate_by.isoformat() if item.investigate_by else None,
                path=_path(item, events),
                key=item.idempotency_key,
                parent=item.parent_id,
            )
        )

    # 1. the boundary, in the ledger ...
    for item in items:
        for name in ("started_at", "submitted_at"):
            at: datetime | None = getattr(item, name)
            if stop_at is not None and at is not None and at >= stop_at:
                out.after_boundary.append(f"item {item.pk} {name.removesuffix('_at')} after the boundary")
    # ... and at the external systems.
    if ctx.sandbox is not None:
        actions = ctx.sandbox.log.arrivals(actions_only=True)
        out.external_actions = len(actions)
        seen: dict[int, int] = {}
        for arrival in actions:
            owner = by_key.get(arrival.key) if arrival.key else None
            if owner is None and arrival.item.isdigit():
                owner = by_id.get(int(arrival.item))
            where = f"{arrival.party} {arrival.method} {arrival.path}" + (f" key {arrival.key}" if arrival.key else "")
            after = stop_at is not None and arrival.at >= stop_at.timestamp()
            if owner is None:
                if after:
                    out.after_boundary.append(f"{where}: arrived after the stop; no item of the task claims it")
                else:
                    out.lost.append(f"{where}: an action no item of the task claims")
                continue
            passed = owner.submitted_at or owner.started_at
            if passed is None or _refused(owner, events):
                out.after_boundary.append(f"{where}: item {owner.pk} never passed the boundary")
                continue
            if arrival.at < passed.timestamp() - CLOCK_SLACK_S:
                out.after_boundary.append(f"{where}: sent before item {owner.pk} passed the boundary")
            seen[owner.pk] = seen.get(owner.pk, 0) + 1
            if seen[owner.pk] > 1 and after:
                # The first request of an item may still be on the wire at the stop; a second one
                # after it is a new submission that never passed the boundary.
                out.after_boundary.append(f"{where}: item {owner.pk} sent again after the stop")

    # 2. nothing lost: the ledger's own states ...
    for item in items:
        if item.state == S.UNCERTAIN and item.investigate_by is None:
            out.lost.append(f"item {item.pk} uncertain without an investigate-by deadline")
        elif item.state == S.QUEUED and stop_at is not None and item.created_at >= stop_at:
            pass  # registered after the stop and never started: nothing was submitted
        elif item.state not in SETTLED:
            out.lost.append(f"item {item.pk} left {item.state}")
    # ... against what the external systems hold: the sandbox's own view of its state, or, on a
    # user's integration, what its contract offers (a lookup by each item's idempotency key).
    by_handle = {i.handle: i for i in items if i.handle}
    world = _world(ctx) if ctx.sandbox is not None else ctx.target.world(items) if ctx.target is not None else []
    if ctx.sandbox is None:
        out.external_actions = len(world)
    for system, key, item_ref, effect in world:
        owner = (by_key.get(key) or by_handle.get(key)) if key else None
        if owner is None and item_ref.isdigit():
            owner = by_id.get(int(item_ref))
        if owner is None:
            out.lost.append(f"{system} {effect} ({key or item_ref}) that no item of the task claims")
            continue
        if owner.state in (S.CANCELLED, S.FAILED) and not owner.needs_review:
            out.lost.append(f"{system} {effect} for item {owner.pk}, which the ledger records {owner.state}")
        if ctx.sandbox is None and (
            (owner.submitted_at is None and owner.started_at is None) or _refused(owner, events)
        ):
            # No request log here: an effect whose item never passed the boundary went out after it.
            out.after_boundary.append(f"{system} {effect}: item {owner.pk} never passed the boundary")

    # 3. the audit.
    for item in items:
        out.audit.extend(_audit_gaps(item, events))
    stops = ledger.stop
    if stops is None:
        if ctx.stop_outcomes:
            out.audit.append("no stop request recorded")
    else:
        if not any(e.kind == "stop_requested" for e in events):
            out.audit.append("stop request without its stop_requested event")
        duplicates = sum(1 for e in events if e.kind == "stop_duplicate")
        if duplicates != stops.duplicates:
            out.audit.append(f"{stops.duplicates} duplicate stops counted, {duplicates} events")
    if ledger.open_attempts:
        out.audit.append(f"{ledger.open_attempts} cancellation attempt(s) never closed")
    return out


@dataclass
class _Ledger:
    items: list[WorkItem]
    events: list[Event]
    stop: StopRequest | None
    open_attempts: int


def _read_ledger(task: Task) -> _Ledger:
    """The task, its items, events, stop request and open attempts as of one moment. Read one by
    one, a worker settling an item between the reads would look like an item whose events end
    somewhere else than its state."""

    def read() -> _Ledger:
        task.refresh_from_db()
        return _Ledger(
            items=list(WorkItem.objects.filter(task=task).order_by("id")),
            events=list(Event.objects.filter(task=task).order_by("id")),
            stop=StopRequest.objects.filter(task=task).first(),
            open_attempts=CancellationAttempt.objects.filter(item__task=task, answered_at__isnull=True).count(),
        )

    with read_snapshot():
        return read()


def _refused(item: WorkItem, events: list[Event]) -> bool:
    return any(e.item_id == item.pk and e.kind == "boundary_refused" for e in events)


def _path(item: WorkItem, events: list[Event]) -> list[str]:
    path: list[str] = []
    for event in events:
        if event.item_id == item.pk and event.to_state and (not path or path[-1] != event.to_state):
            path.append(event.to_state)
    return path


def _audit_gaps(item: WorkItem, events: list[Event]) -> list[str]:
    """Replay the item's events: each move starts where the previous one ended, and the last one
    ends in the recorded state."""
    current = ""
    gaps = []
    for event in events:
        if event.item_id != item.pk or not event.to_state:
            continue
        if event.from_state and event.from_state != current:
            gaps.append(
                f"item {item.pk}: event {event.kind} moves from {event.from_state}, but it was {current or 'nothing'}"
            )
        current = event.to_state
    if current != item.state:
        gaps.append(f"item {item.pk} is {item.state} but its events end at {current or 'nothing'}")
    return gaps


def _world(ctx: DrillContext) -> list[tuple[str, str, str, str]]:
    """(system, idempotency key, item id, effect) for each effect the sandbox parties hold."""
    assert ctx.sandbox is not None
    sandbox = ctx.sandbox.sandbox
    found: list[tuple[str, str, str, str]] = []
    for record in sandbox.crm.records():
        found.append(("crm", record.get("idempotency_key") or "", "", f"record {record['id']} created"))
    for message in sandbox.outbox.messages():
        found.append(("outbox", message.get("idempotency_key") or "", "", f"message {message['id']} sent"))
    for effect in sandbox.mcp.effects():
        # slow_write's call is its key argument (the drills pass the item's idempotency key); a
        # task's is its task id (the item's handle).
        found.append(("mcp", str(effect["call"]), "", f"{effect['tool']} {effect['effect']}"))
    for response in sandbox.openai.responses():
        if _OPENAI_EFFECT.get(response["status"]):
            item = str((response.get("metadata") or {}).get("stopdesk_item", ""))
            found.append(("openai", "", item, f"response {response['id']} {response['status']}"))
    return found
