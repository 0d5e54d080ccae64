"""Ledger scenes for the page tests, built through the services (the factories), never around them."""

from __future__ import annotations

import httpx

from reconcile.models import Compensation
from reconcile.services.compensation import compensation_propose
from stopdesk.models import ExternalRecord, Task, WorkItem
from stopdesk.services.items import item_attach_record, item_finish, item_register
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState, Kind
from tests.factories import ACTOR, make_external_effect, make_item, make_task

S = ItemState


def running_task(title: str = "Draft the Q3 supplier emails") -> Task:
    """Queued drafts, a running worker, a completed draft: what an operator stops."""
    task = make_task(title)
    for _ in range(2):
        make_item(task, noun="draft", kind=Kind.MODEL_REQUEST)
    make_item(task, state=S.RUNNING, noun="export", kind=Kind.LOCAL_WORKER, handle="celery-7f3a")
    make_item(task, state=S.COMPLETED, noun="summary", kind=Kind.MODEL_REQUEST)
    return task


def uncertain_item(task: Task | None = None, *, label: str = "Upload to the partner portal") -> WorkItem:
    task = task or make_task("Sync partner portal")
    item = make_item(
        task, state=S.UNCERTAIN, noun="upload", kind=Kind.REMOTE_TOOL, mechanism="mcp", handle="mcp-req-42", label=label
    )
    return item


def crm_effect(
    crm_url: str, task: Task | None = None, *, name: str = "ACME Ltd", before_stop: bool = False
) -> ExternalRecord:
    """An external operation that really created a record in the sandbox CRM, on a stopped task:
    sent before Stop and answered after it (a reversal candidate), or, with `before_stop`,
    completed before anyone pressed Stop."""
    from stopdesk.services.stop import task_request_stop

    task = task or make_task("Onboard new customers")
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor=ACTOR, mechanism="http")
    key = f"onboard-{item.pk}"
    item_submit(item_id=item.pk, idempotency_key=key, actor=ACTOR)
    response = httpx.post(f"{crm_url}/records", json={"name": name}, headers={"Idempotency-Key": key})
    body = response.json()
    if not before_stop:
        task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    record = item_attach_record(
        item_id=item.pk,
        system="crm",
        record_id=body["id"],
        effect="created",
        actor=ACTOR,
        version=str(body["version"]),
        reversible=True,
        reversal="archive",
        link=f"{crm_url}/records/{body['id']}",
    )
    item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    if before_stop:
        task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    return record


def mail_effect(task: Task | None = None) -> ExternalRecord:
    task = task or make_task("Send renewal reminders")
    item = make_external_effect(task, noun="email", system="outbox", effect="sent", reversible=False, version="")
    from stopdesk.services.stop import task_request_stop

    task_request_stop(task_id=task.pk, actor=ACTOR, dispatch=lambda ids: None)
    return item.external_records.get()


def proposal(record: ExternalRecord, by, action: str = "archive") -> Compensation:  # type: ignore[no-untyped-def]
    return compensation_propose(record_id=record.pk, action=action, by=by, note="Created after Stop; undo it.")


def settle(item_id: int, to: str = S.CANCELLED) -> None:
    """What the reconciler does once it has read the final status back."""
    item = WorkItem.objects.get(pk=item_id)
    if item.state == S.RUNNING and to != S.CANCELLED:
        item_finish(item_id=item_id, succeeded=to == S.COMPLETED, actor=ACTOR)
        return
    if item.state in (S.RUNNING, S.AWAITING_RECONCILIATION):
        item_transition(item_id=item_id, to_state=to, actor="system:reconciler", outcome="cancel confirmed")


__all__ = ["crm_effect", "item_start", "mail_effect", "proposal", "running_task", "settle", "uncertain_item"]
