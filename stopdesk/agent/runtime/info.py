"""The ledger's rows as the answers both doors give (`stopdesk.protocol.types`): one mapper per kind of
answer, so the in-process runtime and the HTTP API cannot describe a row two ways."""

from __future__ import annotations

from stopdesk.models import ExternalRecord, StopRequest, Task, WorkItem
from stopdesk.protocol.types import ItemInfo, RecordInfo, StopInfo, TaskInfo


def task_info(task: Task) -> TaskInfo:
    return TaskInfo(
        id=task.pk,
        title=task.title,
        created_at=task.created_at,
        stop_requested_at=task.stop_requested_at,
        settled_at=task.settled_at,
        stopped=task.stop_requested_at is not None,
        closed_at=task.closed_at,
        closed=task.closed_at is not None,
    )


def item_info(item: WorkItem) -> ItemInfo:
    return ItemInfo(
        id=item.pk,
        task=item.task_id,
        parent=item.parent_id,
        kind=item.kind,
        noun=item.noun,
        state=item.state,
        mechanism=item.mechanism,
        handle=item.handle,
        idempotency_key=item.idempotency_key,
        noun_plural=item.noun_plural,
        label=item.label,
        created_at=item.created_at,
        updated_at=item.updated_at,
        started_at=item.started_at,
        submitted_at=item.submitted_at,
        finished_at=item.finished_at,
        heartbeat_at=item.heartbeat_at,
        lease_until=item.lease_until,
        worker=item.worker,
        cancel_requested_at=item.cancel_requested_at,
        investigate_by=item.investigate_by,
        outcome=item.outcome,
        needs_review=item.review_required,
        detail=item.detail,
        evidence=item.evidence,
    )


def record_info(record: ExternalRecord) -> RecordInfo:
    return RecordInfo(
        id=record.pk,
        item=record.item_id,
        system=record.system,
        record_id=record.record_id,
        effect=record.effect,
        version=record.version,
        reversible=record.reversible,
        reversal=record.reversal,
        link=record.link,
        recorded_at=record.recorded_at,
    )


def stop_info(stop: StopRequest, *, created: bool) -> StopInfo:
    return StopInfo(
        task=stop.task_id,
        requested_at=stop.requested_at,
        actor=stop.actor,
        created=created,
        reason=stop.reason,
        queued_cancelled=stop.queued_cancelled,
        dispatched=stop.dispatched,
        duplicates=stop.duplicates,
    )
