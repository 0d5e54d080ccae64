"""Compensation: a reversal is new work, proposed and approved by people, run once, and only
against the version of the record that was approved.

Each decision is a conditional UPDATE on the compensation's state (filter by id *and* expected
state; exactly one row changes or someone else won) with its audit event in the same
transaction. Execution claims the row the same way, then talks to the other system outside any
transaction, and records the result in a new one (pretix's refund pattern).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.adapter import HttpOperation
from reconcile.models import Compensation, Escalation
from reconcile.services.records import normalize_version, record_learn_version, record_read
from stopdesk.celery import app
from stopdesk.models import ExternalRecord
from stopdesk.services.errors import LedgerError
from stopdesk.services.events import actor_for, event_record
from stopdesk.states import COMPENSATION_TRANSITIONS, CompensationState

C = CompensationState
APPROVE_PERMISSION = "reconcile.approve_compensation"
PROPOSE_PERMISSION = "reconcile.propose_compensation"
EXECUTE_TASK = "reconcile.execute_compensation"


class CompensationRefused(LedgerError):
    code = "compensation_refused"


class ReauthenticationRequired(CompensationRefused):
    code = "reauthentication_required"


REPORT_ONLY = "report_only"


@dataclass(frozen=True)
class Action:
    name: str
    label: str
    writes: bool  # False: nothing is sent to the other system (report only)


REPORT = Action(REPORT_ONLY, "Report only (nothing can be reversed)", writes=False)


def _http() -> HttpOperation:
    """The HTTP adapter reads records back and reverses them, configured per system in
    STOPDESK_MECHANISMS["http"]["options"]["systems"] (never by the record's item)."""
    return cast(HttpOperation, registry.get("http"))


def _reversal(record: ExternalRecord) -> dict[str, Any]:
    item = record.item if record.item_id else None
    return dict(_http().declaration(item.detail if item is not None else {}, system=record.system).get("reverse") or {})


def compensation_request(record: ExternalRecord) -> str:
    """The request a reversal of `record` sends ("POST https://crm.example/records/acc-10/archive"):
    the configured system's template and the recorded record id, shown to people before they
    approve. Empty when the record cannot be reversed."""
    planned = _http().reversal_request(record) if record.reversible else None
    return f"{planned[0]} {planned[1]}" if planned else ""


def compensation_actions(record: ExternalRecord) -> list[Action]:
    """The record's declared reversal, when it has one; otherwise report-only. Never both: a
    reversible record is reversed or accepted as it is (one person, `records_accept_as_is`); a
    system without a declared reversal (a sent email, a system nobody configured) gets
    report-only: never guess."""
    spec = _reversal(record)
    if not record.reversible or not spec.get("url") or not spec.get("action"):
        return [REPORT]
    name = str(spec["action"])
    return [Action(name, str(spec.get("label") or f"{name.capitalize()} the record"), writes=True)]


def compensation_propose(*, record_id: int, action: str, by: Any, note: str = "") -> Compensation:
    """A proposal that writes starts from a fresh read of the record (outside any transaction),
    so it is made at the version the system holds now, and the approver can see what it held."""
    if not by.has_perm(PROPOSE_PERMISSION):
        raise CompensationRefused("Proposing a compensation needs the reviewer role.")
    record = ExternalRecord.objects.select_related("item").get(pk=record_id)
    offered = {a.name: a for a in compensation_actions(record)}
    if action not in offered:
        raise CompensationRefused(f"{action!r} is not an action {record.system} offers for this record.")
    if offered[action].writes and not _in_progress(record):
        record_read(record_id=record.pk, actor=actor_for(by))
    return _propose(record_id=record.pk, action=action, by=by, note=note)


def _in_progress(record: ExternalRecord) -> bool:
    return record.compensations.exclude(state__in=(C.REJECTED, C.FAILED)).exists()


def _propose(
    *, record_id: int, action: str, by: Any, note: str, supersedes: Compensation | None = None
) -> Compensation:
    """Inside the caller's transaction when it has one (proposing again closes the old one in it)."""
    with transaction.atomic():
        record = ExternalRecord.objects.select_for_update(of=("self",)).select_related("item").get(pk=record_id)
        if action not in {a.name for a in compensation_actions(record)}:
            raise CompensationRefused(f"{action!r} is not an action {record.system} offers for this record.")
        if _in_progress(record):
            raise CompensationRefused("This record already has a compensation in progress or done.")
        compensation = Compensation.objects.create(
            external_record=record, action=action, expected_version=record.version, note=note, proposed_by=by
        )
        again = f" again (replacing compensation #{supersedes.pk})" if supersedes else ""
        _event(
            compensation,
            "compensation_proposed",
            actor_for(by),
            "",
            C.PROPOSED,
            f"Proposed {action}{again} of {record.system} {record.record_id} at version {record.version or 'unknown'}.",
            note=note,
            **({"supersedes": supersedes.pk} if supersedes else {}),
        )
    return compensation


def compensation_approve(*, compensation_id: int, by: Any, reauthenticated_at: datetime | None) -> Compensation:
    """Needs the approver permission, a password re-entered within STOPDESK_REAUTH_SECONDS, and an
    approver who is not the proposer. Queues the execution after commit."""
    if not by.has_perm(APPROVE_PERMISSION):
        raise CompensationRefused("Approving a compensation needs the approver role.")
    window = timedelta(seconds=settings.STOPDESK_REAUTH_SECONDS)
    if reauthenticated_at is None or timezone.now() - reauthenticated_at > window:
        raise ReauthenticationRequired("Re-enter your password to approve (it counts for a few minutes).")
    with transaction.atomic():
        compensation = Compensation.objects.select_related("external_record").get(pk=compensation_id)
        if compensation.proposed_by_id == by.pk:
            raise CompensationRefused("You proposed this compensation; another approver must approve it.")
        stale = compensation.observed_version and normalize_version(compensation.observed_version) != normalize_version(
            compensation.expected_version
        )
        if stale:
            raise CompensationRefused(
                "The record changed since this was proposed; propose again at its current version, "
                "or accept it as it is."
            )
        now = timezone.now()
        compensation_move(
            compensation,
            (C.PROPOSED, C.ESCALATED),
            C.APPROVED,
            actor_for(by),
            "compensation_approved",
            "Approved.",
            approved_by=by,
            approved_at=now,
        )
        Escalation.objects.filter(compensation=compensation, closed_at__isnull=True).update(closed_at=now)
        transaction.on_commit(lambda: _enqueue_execution(compensation_id))
    return compensation


def compensation_reject(*, compensation_id: int, by: Any, reason: str) -> Compensation:
    if not by.has_perm(APPROVE_PERMISSION):
        raise CompensationRefused("Rejecting a compensation needs the approver role.")
    if not reason.strip():
        raise CompensationRefused("Say why it is rejected.")
    with transaction.atomic():
        compensation = Compensation.objects.select_related("external_record").get(pk=compensation_id)
        now = timezone.now()
        compensation_move(
            compensation,
            (C.PROPOSED, C.ESCALATED),
            C.REJECTED,
            actor_for(by),
            "compensation_rejected",
            reason,
            rejected_by=by,
            decided_at=now,
            reason=reason,
        )
        Escalation.objects.filter(compensation=compensation, closed_at__isnull=True).update(closed_at=now)
    return compensation


def compensation_escalate(*, compensation_id: int, by: Any, to: Any, reason: str) -> Compensation:
    if not reason.strip():
        raise CompensationRefused("Say why it is escalated.")
    with transaction.atomic():
        compensation = Compensation.objects.select_related("external_record").get(pk=compensation_id)
        compensation_move(
            compensation,
            (C.PROPOSED,),
            C.ESCALATED,
            actor_for(by),
            "compensation_escalated",
            f"Escalated to {to.get_username()}: {reason}",
            escalated_to=to,
            decided_at=timezone.now(),
            reason=reason,
        )
        Escalation.objects.create(compensation=compensation, to=to, by=by, reason=reason)
    return compensation


def compensation_execute(*, compensation_id: int) -> Compensation:
    """Run an approved compensation once. A second caller (a redelivered job, a second approval's
    job) finds it no longer approved and does nothing. Never touches the task or its items."""
    with transaction.atomic():
        compensation = Compensation.objects.select_related("external_record__item").get(pk=compensation_id)
        if compensation.state != C.APPROVED:
            return compensation
        try:
            # The claim: exactly one caller moves it from approved to running.
            compensation_move(
                compensation,
                (C.APPROVED,),
                C.RUNNING,
                "system:compensation",
                "compensation_started",
                "Reading the record's current version.",
                started_at=timezone.now(),
            )
        except CompensationRefused:
            return compensation  # another worker claimed it between our read and our update
    record = compensation.external_record
    expected = normalize_version(compensation.expected_version)
    if compensation.action == REPORT_ONLY:
        # Nothing is sent anywhere: the compensation is the recorded report.
        observed = expected
        result: dict[str, Any] = {
            "reported": True,
            "note": f"{record.system} {record.record_id} cannot be reversed; reported only, nothing was sent.",
        }
        done = f"Reported only: nothing was sent to {record.system}."
    elif compensation.action not in {a.name for a in compensation_actions(record)}:
        return _fail(compensation, f"{record.system} offers no {compensation.action} for this record")
    else:
        # The read is kept (the ledger learns a newer version from it); its call runs outside
        # any transaction: the other system may be slow, and our rows must not wait on it.
        read = record_read(record_id=record.pk, actor="system:compensation", compensation_id=compensation.pk)
        if not read.ok:
            return _fail(compensation, f"Could not read the record's current version: {read.error}".strip())
        observed = normalize_version(read.version)
        if observed != expected:
            return _escalate_stale(compensation, expected, observed)
        reversal = _http().reverse(record, expected, actor="stopdesk:compensation")
        if reversal.outcome == "version_mismatch":
            # Someone edited between our read and our write; the precondition caught it. Read
            # again so the person deciding sees what the record holds now.
            record_read(record_id=record.pk, actor="system:compensation", compensation_id=compensation.pk)
            return _escalate_stale(compensation, expected, normalize_version(reversal.current_version))
        if not reversal.done:
            status = f"HTTP {reversal.status_code} " if reversal.status_code else ""
            return _fail(compensation, f"{compensation.action} {record.record_id}: {status}{reversal.error}".strip())
        result = {
            "status": reversal.body.get("status"),
            "version": normalize_version(reversal.new_version),
            "request": reversal.request,
        }
        done = f"{compensation.action} done at version {expected}."
    with transaction.atomic():
        compensation_move(
            compensation,
            (C.RUNNING,),
            C.DONE,
            "system:compensation",
            "compensation_done",
            done,
            finished_at=timezone.now(),
            observed_version=observed,
            result={**result, "expected_version": expected, "observed_version": observed},
        )
        if result.get("version"):
            # The reversal itself moved the record on (an archive is a new version).
            record_learn_version(record=record, version=str(result["version"]), actor="system:compensation")
    return compensation


def compensations_sweep(
    *,
    now: datetime | None = None,
    interrupted_after_s: float = 600.0,
    requeue_after_s: float = 60.0,
    enqueue: Callable[[int], None] | None = None,
) -> dict[str, list[int]]:
    """Nothing is left half-done forever. An approved compensation whose job never ran (the broker
    lost it) is queued again; running it twice is safe, its claim lets one caller through. One
    left running past every time limit lost its worker mid-action: nobody knows whether the write
    happened, so it is escalated for a person, never retried on its own."""
    now = now or timezone.now()
    send = enqueue or _enqueue_execution
    requeued = list(
        Compensation.objects.filter(
            state=C.APPROVED, approved_at__lt=now - timedelta(seconds=requeue_after_s)
        ).values_list("pk", flat=True)
    )
    for compensation_id in requeued:
        send(compensation_id)
    interrupted = []
    stale = Compensation.objects.filter(
        state=C.RUNNING, started_at__lt=now - timedelta(seconds=interrupted_after_s)
    ).select_related("external_record__item")
    for compensation in stale:
        with transaction.atomic():
            try:
                compensation_move(
                    compensation,
                    (C.RUNNING,),
                    C.ESCALATED,
                    "system:compensation-sweep",
                    "compensation_interrupted",
                    "Its worker was lost while it ran; whether the action reached the record is unknown. "
                    "Check the record before deciding.",
                    finished_at=now,
                    reason="Interrupted mid-run: check the record before approving again or rejecting.",
                )
                _escalated_by_stopdesk(compensation)
            except CompensationRefused:
                continue  # it finished meanwhile
        interrupted.append(compensation.pk)
    return {"requeued": requeued, "interrupted": interrupted}


def _escalate_stale(compensation: Compensation, expected: str, observed: str) -> Compensation:
    reason = f"The record changed: approved against version {expected}, it is now at version {observed}. Nothing was written."
    with transaction.atomic():
        compensation_move(
            compensation,
            (C.RUNNING,),
            C.ESCALATED,
            "system:compensation",
            "compensation_stale",
            reason,
            observed_version=observed,
            finished_at=timezone.now(),
            decided_at=timezone.now(),
            reason=reason,
            result={"expected_version": expected, "observed_version": observed, "written": False},
        )
        _escalated_by_stopdesk(compensation)
    return compensation


def _escalated_by_stopdesk(compensation: Compensation) -> None:
    """The escalation row a person's escalation also writes: one open row per compensation
    waiting on a decision, closed when it is approved or rejected."""
    Escalation.objects.create(compensation=compensation, to=None, by=None, reason=compensation.reason)


def _fail(compensation: Compensation, error: str) -> Compensation:
    with transaction.atomic():
        compensation_move(
            compensation,
            (C.RUNNING,),
            C.FAILED,
            "system:compensation",
            "compensation_failed",
            error,
            finished_at=timezone.now(),
            error=error,
        )
    return compensation


def compensation_move(
    compensation: Compensation,
    from_states: tuple[str, ...],
    to_state: str,
    actor: str,
    kind: str,
    message: str,
    **fields: Any,
) -> None:
    """Every move of a compensation's state: checked against `COMPENSATION_TRANSITIONS`, a
    conditional UPDATE (by id *and* from-state: exactly one row changes or someone else won), and
    its audit event, in the caller's transaction. The initial state is the model's default."""
    for state in from_states:
        if to_state not in COMPENSATION_TRANSITIONS[state]:
            raise ValueError(f"compensation {state} -> {to_state} is not an allowed move")
    moved = Compensation.objects.filter(pk=compensation.pk, state__in=from_states).update(state=to_state, **fields)
    if not moved:
        current = Compensation.objects.values_list("state", flat=True).get(pk=compensation.pk)
        raise CompensationRefused(f"This compensation is already {current}; it cannot become {to_state}.")
    before = compensation.state
    compensation.refresh_from_db()
    _event(compensation, kind, actor, before, to_state, message)


def _event(
    compensation: Compensation, kind: str, actor: str, before: str, after: str, message: str, **data: Any
) -> None:
    record = compensation.external_record
    event_record(
        kind=kind,
        actor=actor,
        item=record.item,
        from_state=before,
        to_state=after,
        message=message,
        data={"compensation": compensation.pk, "record": f"{record.system}:{record.record_id}", **data},
    )


def _enqueue_execution(compensation_id: int) -> None:
    """By task name, the one call of reconcile's own tasks from its services: tasks sit above
    services in the stack (they call services), so this cannot be an import."""
    if app.conf.task_always_eager:
        # A web process never started a worker, so autodiscovery has not run yet.
        app.loader.import_default_modules()
        app.tasks[EXECUTE_TASK].apply(args=[compensation_id])
    else:
        app.send_task(EXECUTE_TASK, args=[compensation_id])
