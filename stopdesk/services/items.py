"""Registering work items and recording what their runtimes report. The writes of state go through
`stopdesk.services.transitions`."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.declared import steering_problem
from stopdesk import ports
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.protocol.spec import ItemSpec
from stopdesk.record_ids import record_id_problem
from stopdesk.services.closing import task_open_check
from stopdesk.services.errors import (
    DeclarationRefused,
    HandleConflict,
    Held,
    IllegalTransition,
    InvalidRecordId,
    TaskStopped,
    UnknownMechanism,
)
from stopdesk.services.events import event_record
from stopdesk.services.sql import ClockNow, TokenHeld, is_postgres
from stopdesk.services.transitions import (
    Hold,
    Refused,
    Then,
    item_late_result,
    item_observed_started,
    item_register_pass,
    item_register_pass_async,
    item_start,
    item_submit,
    item_transition,
    task_gate_shared,
)
from stopdesk.services.transitions.settled import task_reopen
from stopdesk.states import IN_FLIGHT, TERMINAL, UNSTARTED, ItemState, Kind

if TYPE_CHECKING:
    import psycopg

S = ItemState


def task_create(*, title: str, actor: str, owner: Any = None, runtime: Any = None) -> Task:
    with transaction.atomic():
        task = Task.objects.create(title=title, owner=owner, runtime=runtime)
        event_record(kind="task_created", actor=actor, task=task, message=title)
    return task


def item_register(
    *,
    task: Task | int,
    actor: str,
    spec: ItemSpec | None = None,
    observed: bool = False,
    started_at: datetime | None = None,
    refused_outcome: str = "registered after Stop; never started",
    **fields: Any,
) -> WorkItem:
    """Record a child before it is dispatched: `spec`, or its fields as keywords (`kind=`, `noun=`,
    a `parent` item or its id, ...). Registering after Stop is allowed (the record must be
    complete), but such an item can never pass the boundary.

    `observed` records work that already ran outside our boundary (a tool a model response called
    on the provider's side, found in its output): it is registered and then recorded running
    (`item_observed_started`), because it did start, and is not cancelled by a Stop that came
    after it started. Its start is `started_at` when the caller knows it, else the start of the
    parent that launched it (the response was active then), never the time it was found.
    `refused_outcome` is what an item registered after Stop (and so cancelled) says of itself.

    A closed task takes no new work: TaskClosed, and nothing is written."""
    spec = spec or _spec(fields)
    _registrable(kind=spec.kind, mechanism=spec.mechanism, detail=spec.detail)
    task_id = task if isinstance(task, int) else task.pk
    parent_id = spec.parent
    with transaction.atomic():
        task_open_check(task_id=task_id)
        columns = {**spec.to_json(), "parent_id": parent_id, "detail": spec.detail or {}}
        del columns["parent"]
        item = WorkItem.objects.create(task_id=task_id, **columns)
        event_record(
            kind="item_registered",
            actor=actor,
            item=item,
            to_state=item.state,
            data={"noun": spec.noun, "kind": spec.kind, **({"observed": True} if observed else {})},
        )
        if observed:
            began = started_at or _launched_at(parent_id) or timezone.now()
            item_observed_started(item_id=item.pk, actor=actor, started_at=began)
            item.refresh_from_db(fields=["state", "started_at", "updated_at"])
        if not observed and Task.objects.filter(pk=task_id, stop_requested_at__isnull=False).exists():
            # Recorded, so the ledger is complete, but it can never start: settle it now rather
            # than leave the stopped task looking unsettled. (A registration racing the stop's
            # own fan-out is caught by stops_resume_fanout.)
            item = item_transition(
                item_id=item.pk,
                to_state=S.CANCELLED,
                actor=actor,
                outcome=refused_outcome,
                kind="boundary_refused",
            )
        else:
            task_reopen(task_id=task_id, actor=actor)
    return item


def _launched_at(parent_id: int | None) -> datetime | None:
    """When the parent began: its start, or for a parent the boundary refused (a model request
    already sent when Stop was seen) when it was recorded, as its request went out."""
    if parent_id is None:
        return None
    row = WorkItem.objects.filter(pk=parent_id).values_list("started_at", "created_at").first()
    return (row[0] or row[1]) if row else None


def item_register_started(
    *,
    task_id: int,
    actor: str,
    worker: str = "",
    lease_seconds: int | None = None,
    submit_key: str = "",
    runtime_id: int | None = None,
    spec: ItemSpec | None = None,
    hold: Hold | None = None,
    **fields: Any,
) -> int | None:
    """Register a child and pass the boundary (start, or submit with `submit_key`): for work that
    starts the moment it is known (a framework's tool call or model request). On PostgreSQL one
    statement, so one round trip; elsewhere one transaction. Returns the item id, None if there is
    no such task (of the runtime `runtime_id`, when given); raises TaskStopped after Stop, with the
    item recorded and cancelled, so the ledger still has every call, and Held, having written
    nothing, when `hold` names an item that holds it back (checked first). The item is `spec`,
    or its fields as keywords."""
    spec = spec or _spec(fields)
    _registrable(kind=spec.kind, mechanism=spec.mechanism, detail=spec.detail)
    if is_postgres() and spec.parent is None:
        try:
            return item_register_pass(
                task_id=task_id,
                runtime_id=runtime_id,
                actor=actor,
                worker=worker,
                lease_seconds=lease_seconds,
                submit_key=submit_key,
                spec=spec,
                hold=hold,
            )
        except Refused:
            pass  # stopped: the path below records the item and its refusal
    tasks = Task.objects.filter(pk=task_id)
    if runtime_id is not None:
        tasks = tasks.filter(runtime_id=runtime_id)
    with transaction.atomic():
        if hold is not None and (held_by := hold.check()) is not None:
            raise Held(held_by)
        # The gate first (the boundary below takes it again, which a holder may), then the task
        # row: Stop takes them in that order, so a start holding the row while waiting for the
        # gate behind Stop would deadlock with it. The row lock serialises registrations that may
        # reopen a settled task (an UPDATE of that row); two parallel tool calls taking the row
        # in different orders deadlocked. NO KEY UPDATE, as an UPDATE takes: it leaves the
        # foreign-key checks of other writers' events (KEY SHARE) free.
        task_gate_shared(task_id)
        if not list(tasks.select_for_update(no_key=True).values_list("pk", flat=True)):
            return None
        item = item_register(task=task_id, actor=actor, spec=spec)
        stopped = item.state == S.CANCELLED  # registered after Stop
        if not stopped:
            try:
                if submit_key:
                    item_submit(
                        item_id=item.pk,
                        idempotency_key=submit_key,
                        actor=actor,
                        worker=worker,
                        lease_seconds=lease_seconds,
                    )
                else:
                    item_start(item_id=item.pk, actor=actor, worker=worker, lease_seconds=lease_seconds)
            except TaskStopped:
                stopped = True  # the boundary cancelled it; that write commits with the registration
    if stopped:
        raise TaskStopped(task_id, item.pk)
    return item.pk


class NotInOneStatement(Exception):
    """`item_register_started_async` cannot register this item in its one statement, and wrote
    nothing: the task is stopped (the portable path records the item and its refusal), or the
    statement is not all there is to it (SQLite, a child of a parent, the readiness policy's check,
    which reads the database). The caller takes `item_register_started` in a thread."""


async def item_register_started_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    task_id: int,
    actor: str,
    worker: str = "",
    submit_key: str = "",
    hold: Hold | None = None,
    runtime_id: int | None = None,
    lease_seconds: int | None = None,
    held: TokenHeld | None = None,
    then: Then | None = None,
    **fields: Any,
) -> int | None:
    """`item_register_started` for an asyncio caller on a connection of its own: the MCP gateway's
    loop, which then waits for no thread on a call's way upstream, and the agent door's. The same
    one statement with the same answers (the item id, None for no such task, of the runtime
    `runtime_id` when given, or when that runtime no longer holds the token `held`, Held,
    TaskClosed); NotInOneStatement where that statement is not the whole registration. `then`: a
    write of the caller's made by the same statement (`Then`)."""
    spec = _spec(fields)
    if not is_postgres() or spec.parent is not None or _readiness_on():
        raise NotInOneStatement
    _registrable(kind=spec.kind, mechanism=spec.mechanism, detail=spec.detail)
    try:
        return await item_register_pass_async(
            conn,
            task_id=task_id,
            actor=actor,
            spec=spec,
            worker=worker,
            submit_key=submit_key,
            hold=hold,
            runtime_id=runtime_id,
            lease_seconds=lease_seconds,
            held=held,
            then=then,
        )
    except Refused:
        raise NotInOneStatement from None


def _spec(fields: dict[str, Any]) -> ItemSpec:
    """The keyword form's spec; a parent may be given as the item itself."""
    parent = fields.get("parent")
    if parent is not None and not isinstance(parent, int):
        fields = {**fields, "parent": parent.pk}
    return ItemSpec(**fields)


def _registrable(*, kind: str, mechanism: str, detail: dict[str, Any] | None) -> None:
    if kind not in Kind.values:
        raise ValueError(f"Unknown kind {kind!r}; expected one of {', '.join(Kind.values)}.")
    if not registry.known(mechanism):
        raise UnknownMechanism(mechanism, registry.names())
    detail_declarable(detail)
    _readiness_check(mechanism=mechanism, kind=kind, detail=detail)


def detail_declarable(detail: dict[str, Any] | None) -> None:
    """Refuse a declaration that tries to choose where the server connects (DeclarationRefused,
    naming the field): every write of runtime-supplied detail goes through here."""
    if (refusal := steering_problem(detail)) is not None:
        raise DeclarationRefused(refusal.field, refusal.message)


def _readiness_check(*, mechanism: str, kind: str, detail: dict[str, Any] | None) -> None:
    """The readiness policy's hook (STOPDESK_READINESS_POLICY, off by default). The check lives
    with the mechanisms and comes through the ledger's port (`stopdesk.ports`), so the ledger does
    not import the reconcile app; it raises ToolNotReady to refuse."""
    if _readiness_on():
        ports.registration_check(mechanism=mechanism, kind=kind, detail=detail)


def _readiness_on() -> bool:
    """Whether a registration asks the readiness policy (whose check may read the database)."""
    return getattr(settings, "STOPDESK_READINESS_POLICY", "off") != "off"


def item_finish(
    *, item_id: int, succeeded: bool, actor: str, outcome: str = "", evidence: dict[str, Any] | None = None
) -> WorkItem:
    """A worker or runtime reports the result. If the item already reached a different final state
    (for example Stop cancelled it), the report is a late result: kept as an event and flagged for
    review, never written over the recorded outcome."""
    to_state = S.COMPLETED if succeeded else S.FAILED
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if item.state in TERMINAL | UNSTARTED:
            if item.state == to_state:
                return item  # a repeated report of the same result changes nothing
            return item_late_result(item=item, reported=to_state, actor=actor, outcome=outcome, evidence=evidence)
        return item_transition(item_id=item_id, to_state=to_state, actor=actor, outcome=outcome, evidence=evidence)


def item_report_stopped(*, item_id: int, actor: str, outcome: str = "stopped between steps") -> WorkItem:
    """A worker says it stopped cooperatively. That settles an item still in flight, or an
    uncertain one (the worker's word is the fact a reviewer lacked); an item already recorded
    otherwise keeps its outcome and the report becomes a late result."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if item.state in (S.RUNNING, S.AWAITING_RECONCILIATION, S.UNCERTAIN):
            return item_transition(item_id=item_id, to_state=S.CANCELLED, actor=actor, outcome=outcome)
        if item.state == S.CANCELLED:
            return item
        return item_late_result(item=item, reported=S.CANCELLED, actor=actor, outcome=outcome)


def item_heartbeat(*, item_id: int, lease_seconds: int | None = None) -> bool:
    """Extend a running item's lease. Returns whether Stop was requested for its task."""
    lease = timedelta(seconds=lease_seconds or settings.STOPDESK["LEASE_SECONDS"])
    now = timezone.now()
    WorkItem.objects.filter(pk=item_id, state=S.RUNNING).update(heartbeat_at=ClockNow(), lease_until=now + lease)
    return stop_requested(item_id=item_id)


def item_set_handle(*, item_id: int, handle: str, actor: str, detail: dict[str, Any] | None = None) -> WorkItem:
    """Record the remote id of work already dispatched (a response id, an MCP task id, an operation
    URL), with an event. The boundary's rules: only for an item that passed the boundary (work
    that never started has nothing to point at: IllegalTransition), one handle per item (another
    one is HandleConflict; the same one again changes nothing). After Stop it is still recorded,
    and an item whose cancel is already requested is due at once, so the canceller acts on it."""
    detail_declarable(detail)
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        if item.started_at is None:
            raise IllegalTransition(item.pk, item.state, "handle recorded")
        if item.handle and item.handle != handle:
            raise HandleConflict(item.pk, item.handle)
        if item.handle == handle and not detail:
            return item
        item.handle = handle
        if detail:
            item.detail = {**item.detail, **detail}
        fields = ["handle", "detail"]
        if item.cancel_requested_at is not None and item.state in IN_FLIGHT:
            item.next_check_at = timezone.now()
            fields.append("next_check_at")
        item.save(update_fields=fields)
        event_record(kind="handle_recorded", actor=actor, item=item, message=handle, data={"detail": detail or {}})
    return item


def item_record_detail(*, item_id: int, detail: dict[str, Any], actor: str) -> WorkItem:
    """Merge mechanism facts (server, tool annotations, protocol version, how to look an action
    up...) into the item, with an event when they change it (the same facts again change nothing)."""
    detail_declarable(detail)
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        merged = {**item.detail, **detail}
        if merged == item.detail:
            return item
        item.detail = merged
        item.save(update_fields=["detail"])
        event_record(
            kind="detail_recorded",
            actor=actor,
            item=item,
            from_state=item.state,
            to_state=item.state,
            message=", ".join(sorted(detail)),
            data={"detail": detail},
        )
    return item


def item_note_evidence(*, item_id: int, evidence: dict[str, Any], actor: str, message: str) -> None:
    """Add an observation to an item's evidence without changing its state (progress the server
    kept reporting after a cancel, say), with an event saying what was seen."""
    with transaction.atomic():
        item = WorkItem.objects.select_for_update().get(pk=item_id)
        item.evidence = {**item.evidence, **evidence}
        item.save(update_fields=["evidence"])
        event_record(
            kind="evidence",
            actor=actor,
            item=item,
            from_state=item.state,
            to_state=item.state,
            message=message,
            data={"evidence": evidence},
        )


def item_state_of(*, item_id: int) -> str:
    return str(WorkItem.objects.values_list("state", flat=True).get(pk=item_id))


def item_task_id(*, item_id: int) -> int:
    return int(WorkItem.objects.values_list("task_id", flat=True).get(pk=item_id))


def stop_requested(*, item_id: int) -> bool:
    return Task.objects.filter(items__pk=item_id, stop_requested_at__isnull=False).exists()


def item_attach_record(
    *,
    item_id: int,
    system: str,
    record_id: str,
    effect: str,
    actor: str,
    version: str = "",
    reversible: bool = False,
    reversal: str = "",
    link: str = "",
) -> ExternalRecord:
    """Report an effect in another system. Attaching the same record to the same item again
    updates its version. The same record attached to another item is recorded there too: each
    item keeps its own effect, and nobody can block or probe another's (see `_note_shared`).

    An id that cannot be sent back to its system as one URL path segment is refused: a
    compensation would otherwise act on whatever record it names."""
    if (problem := record_id_problem(record_id)) is not None:
        raise InvalidRecordId(f"The record id {record_id[:80]!r} {problem}.")
    with transaction.atomic():
        # The item's row only (`of`): with its task joined, FOR UPDATE took the task row too, and
        # every registration and Stop of the task queued behind a record being attached.
        item = WorkItem.objects.select_for_update(of=("self",)).select_related("task").get(pk=item_id)
        _lock_record_key(system, record_id)
        record, created = ExternalRecord.objects.update_or_create(
            item=item,
            system=system,
            record_id=record_id,
            defaults={
                "version": version,
                "effect": effect,
                "reversible": reversible,
                "reversal": reversal,
                "link": link,
            },
        )
        event_record(
            kind="external_record" if created else "external_record_updated",
            actor=actor,
            item=item,
            message=f"{system} {record_id} {effect} (version {version or 'unknown'})",
            data={
                "system": system,
                "record_id": record_id,
                "version": version,
                "effect": effect,
                "reversible": reversible,
            },
        )
        if created:
            _note_shared(item, record, actor)
    return record


def _lock_record_key(system: str, record_id: str) -> None:
    """Serialise attaches of one (system, record id) so two concurrent ones see each other and
    both get flagged. SQLite serialises writers anyway."""
    if connection.vendor != "postgresql":
        return
    digest = hashlib.sha256(f"{system}\0{record_id}".encode()).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)])


def _note_shared(item: WorkItem, record: ExternalRecord, actor: str) -> None:
    """The same external record is the effect of more than one item. Within one runtime (or the
    in-process API) both items are flagged for review: two tasks really touched one record.
    Across runtimes each item only gets an event for people reading the trail; no flag a runtime
    could read back, so no runtime learns which ids another has recorded."""
    others = (
        ExternalRecord.objects.filter(system=record.system, record_id=record.record_id)
        .exclude(pk=record.pk)
        .select_related("item__task")
    )
    for other in others:
        same_runtime = other.item.task.runtime_id == item.task.runtime_id
        for mine, theirs in ((item, other.item), (other.item, item)):
            where = f"item {theirs.pk} (task {theirs.task_id})" if same_runtime else "an item of another runtime"
            event_record(
                kind="record_shared",
                actor=actor,
                item=mine,
                message=f"{record.system} {record.record_id} is also recorded as the effect of {where}.",
                data={"system": record.system, "record_id": record.record_id, "flagged": same_runtime},
            )
        if same_runtime:
            WorkItem.objects.filter(pk__in=[item.pk, other.item_id]).update(needs_review=True)
