"""Reconciling one item: claim it, ask its adapter, let the engine decide, apply the plan.

Pretix's habit: the attempt is recorded in a short transaction, the remote call is made outside
any transaction, and its answer is recorded in a new one. States change only through the ledger's
services (item_transition, item_finish, items_move).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from reconcile import engine
from reconcile.mechanisms import registry
from reconcile.mechanisms.base import Capability, ItemRef, Mechanism, Observation, Seen
from reconcile.services.launched import response_launched_record
from reconcile.services.lease import ClaimLease, lease_seconds
from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import item_attach_record, item_finish, item_record_detail
from stopdesk.services.sql import is_postgres
from stopdesk.services.transitions import Schedule, item_late_result_record, item_transition, items_move, items_schedule
from stopdesk.states import SETTLED, SWEPT, TERMINAL, ItemState

log = logging.getLogger(__name__)
S = ItemState

# Swept states. `cancelled` is here for the flip watch; it is due only while next_check_at is set.
# Completed and failed are here because a worker may settle an item while a check is scheduled;
# the pass then only clears the schedule.
ACTOR = "system:reconcile"


def claim_seconds() -> float:
    return float(settings.STOPDESK.get("RECONCILE_CLAIM_SECONDS", 120))


# --- claiming: two sweeps (or a sweep and a cancel job) never work on one item at once ----------


def item_claim(*, item_id: int, now: datetime | None = None, hold_s: float | None = None) -> bool:
    """Claim one item if it is due (or was never scheduled), for `hold_s` (default: the claim
    seconds). A conditional UPDATE: exactly one caller wins; the claim pushes next_check_at past
    the work, so nobody else picks it up."""
    now = now or timezone.now()
    won = WorkItem.objects.filter(_due(now), pk=item_id, state__in=SWEPT).update(
        next_check_at=now + timedelta(seconds=hold_s if hold_s is not None else claim_seconds()),
        check_count=F("check_count") + 1,
    )
    return won == 1


def items_claim(*, item_ids: list[int], now: datetime | None = None, hold_s: float | None = None) -> list[int]:
    """Claim the given items that are due (or never scheduled), in one statement per 1,000.
    `hold_s` (default: the claim seconds) must outlast the work on all of them. Returns the ids won.

    A row another transaction holds is skipped rather than waited for; it stays due, and
    `items_due` finds it for the caller to try again. NO KEY: a row another transaction only
    references (an event or an attempt being inserted for the item holds it FOR KEY SHARE) is not
    skipped."""
    now = now or timezone.now()
    until = now + timedelta(seconds=hold_s if hold_s is not None else claim_seconds())
    won: list[int] = []
    for start in range(0, len(item_ids), 1000):
        chunk = item_ids[start : start + 1000]
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute(_CLAIM_GIVEN_SQL, {"ids": chunk, "states": sorted(SWEPT), "now": now, "until": until})
                won.extend(row[0] for row in cursor.fetchall())
            continue
        with transaction.atomic():  # SQLite: transactions are serialised, so read-then-write is safe
            due = list(WorkItem.objects.filter(_due(now), pk__in=chunk, state__in=SWEPT).values_list("id", flat=True))
            WorkItem.objects.filter(pk__in=due).update(next_check_at=until, check_count=F("check_count") + 1)
        won.extend(due)
    return sorted(won)


# One statement (so one round trip, and atomic without a transaction of its own).
_CLAIM_GIVEN_SQL = """
UPDATE stopdesk_workitem SET next_check_at = %(until)s, check_count = check_count + 1
WHERE id IN (
    SELECT id FROM stopdesk_workitem
    WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(states)s)
      AND (next_check_at IS NULL OR next_check_at <= %(now)s)
    FOR NO KEY UPDATE SKIP LOCKED
)
RETURNING id
"""


def items_due(*, item_ids: list[int], now: datetime | None = None) -> list[int]:
    """The given items a claim would take now if no one held their rows: after `items_claim`,
    the ones it skipped because another transaction held them at that moment (nobody claimed
    them; they are still due)."""
    now = now or timezone.now()
    return sorted(WorkItem.objects.filter(_due(now), pk__in=item_ids, state__in=SWEPT).values_list("id", flat=True))


def _due(now: datetime) -> Q:
    return Q(next_check_at__isnull=True) | Q(next_check_at__lte=now)


_CLAIM_SQL = """
UPDATE stopdesk_workitem SET next_check_at = %(until)s, check_count = check_count + 1
WHERE id IN (
    SELECT id FROM stopdesk_workitem
    WHERE state = ANY(%(states)s) AND next_check_at <= %(now)s
    ORDER BY next_check_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
)
RETURNING id
"""


def items_claim_due(*, now: datetime | None = None, limit: int = 200, hold_s: float | None = None) -> list[int]:
    """Claim a bounded batch of due items for `hold_s` (default: the claim seconds). SKIP LOCKED
    lets concurrent sweeps take disjoint rows instead of queueing behind each other; the pushed
    next_check_at keeps them disjoint after commit."""
    now = now or timezone.now()
    until = now + timedelta(seconds=hold_s if hold_s is not None else claim_seconds())
    if is_postgres():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, {"until": until, "states": sorted(SWEPT), "now": now, "limit": limit})
            return sorted(row[0] for row in cursor.fetchall())
    with transaction.atomic():  # SQLite: transactions are serialised (IMMEDIATE), so read-then-write is safe
        ids = list(
            WorkItem.objects.filter(state__in=SWEPT, next_check_at__lte=now)
            .order_by("next_check_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        WorkItem.objects.filter(id__in=ids).update(next_check_at=until, check_count=F("check_count") + 1)
    return sorted(ids)


# --- one item ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    item_id: int
    action: str
    seen: str
    state: str


def item_reconcile(*, item_id: int, actor: str = ACTOR, now: datetime | None = None, claimed: bool = False) -> Result:
    """Cancel (when a stop asked for it and the cancel has not been answered yet) or inspect one
    item, and apply what the engine decides."""
    now = now or timezone.now()
    if claimed:
        return _reconcile_claimed(item_id=item_id, actor=actor, now=now)
    # As the sweep's and the batch's: a lease renewed while the call is out, so a cancel job whose
    # worker dies leaves its item due again within one lease.
    lease_s = lease_seconds()
    if not item_claim(item_id=item_id, now=now, hold_s=lease_s):
        item = WorkItem.objects.get(pk=item_id)
        return Result(item_id, "skipped", "", item.state)
    with ClaimLease(item_ids=[item_id], now=now, until=now + timedelta(seconds=lease_s)):
        return _reconcile_claimed(item_id=item_id, actor=actor, now=now)


def _reconcile_claimed(*, item_id: int, actor: str, now: datetime) -> Result:
    item = WorkItem.objects.get(pk=item_id)
    mechanism = registry.get(item.mechanism)
    if item.state in TERMINAL and item.state != S.CANCELLED:
        _schedule(item_id=item.pk, next_check_at=None)
        return Result(item_id, "none", "", item.state)
    action = choose_action(item, mechanism)
    attempt = CancellationAttempt.objects.create(item=item, mechanism=mechanism.name, action=action, sent_at=now)
    observation = observe(mechanism, ItemRef.of(item), action)
    return attempt_apply(item, mechanism, attempt, observation, action=action, actor=actor, now=now)


def observe(mechanism: Mechanism, ref: ItemRef, action: str) -> Observation:
    """The adapter's cancel or inspect. Adapters do not raise for remote failures; an adapter bug
    must not leave the attempt open or stop a sweep, so it is an unreachable observation."""
    try:
        return mechanism.cancel(ref) if action == "cancel" else mechanism.inspect(ref)
    except Exception as exc:
        log.exception("%s %s of item %s raised", mechanism.name, action, ref.id)
        return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__, message=str(exc)[:300])


def choose_action(item: WorkItem, mechanism: Mechanism) -> str:
    if item.cancel_requested_at is None or not mechanism.can(Capability.CANCEL, ItemRef.of(item)):
        return "inspect"
    if item.state not in (S.RUNNING, S.AWAITING_RECONCILIATION):
        return "inspect"
    # One answered cancel is the cancel: later passes only read back, so a repeated pass (a
    # duplicate job, a retry after a lost read-back) has no second effect on the remote side.
    answered = bool((item.evidence.get("reconcile") or {}).get("cancel_answered"))
    if answered and mechanism.cancel_is_final(ItemRef.of(item)):
        return "inspect"
    return "cancel"


def attempt_close(attempt_id: int, observation: Observation) -> None:
    CancellationAttempt.objects.filter(pk=attempt_id).update(answered_at=timezone.now(), **attempt_result(observation))


def attempt_result(observation: Observation) -> dict[str, Any]:
    """The columns that record what came back for an attempt."""
    return {
        "ok": observation.seen not in (Seen.UNREACHABLE,),
        "observed_status": (observation.remote_status or str(observation.seen))[:64],
        "detail": {
            "seen": str(observation.seen),
            "message": observation.message,
            "cancel_sent": observation.cancel_sent,
            **observation.detail,
        },
    }


def item_apply(
    *,
    item_id: int,
    mechanism: Mechanism,
    observation: Observation,
    actor: str,
    now: datetime,
    action: str,
    attempt_id: int,
) -> Result:
    """Read the item again, let the engine decide on `observation`, and apply the plan through the
    ledger's services, one item at a time."""
    item = WorkItem.objects.get(pk=item_id)
    decision = decide(
        item=item, mechanism=mechanism, observation=observation, now=now, action=action, attempt_id=attempt_id
    )
    plan, progress, evidence = decision.plan, decision.progress, decision.evidence
    if observation.record is not None:
        _attach(item_id, observation, actor)
    if observation.final and observation.detail.get("tool_calls"):
        # What the response launched itself is only known once it has stopped changing.
        response_launched_record(item_id=item_id, calls=observation.detail["tool_calls"], actor=actor)

    if plan.late_result is not None:
        _late_result(item_id=item_id, reported=plan.late_result, actor=actor, outcome=plan.outcome, evidence=evidence)
        _schedule(item_id=item_id, next_check_at=None, progress=progress)
    elif plan.to_state in (S.COMPLETED, S.FAILED):
        item_finish(
            item_id=item_id,
            succeeded=plan.to_state == S.COMPLETED,
            actor=actor,
            outcome=plan.outcome,
            evidence=evidence,
        )
        _schedule(item_id=item_id, next_check_at=None, progress=progress)
    elif plan.to_state is not None:
        extra: dict[str, Any] = {"next_check_at": plan.next_check_at}
        if plan.investigate_by is not None:
            extra["investigate_by"] = plan.investigate_by
        try:
            item_transition(
                item_id=item_id,
                to_state=plan.to_state,
                actor=actor,
                outcome=plan.outcome,
                evidence={**evidence, "reconcile": progress},
                message=plan.reason,
                kind="reconciled" if plan.to_state in SETTLED else "transition",
                **extra,
            )
        except IllegalTransition as exc:
            # Someone settled it between our read and our write (the worker reported, a person
            # resolved it). Theirs stands; ours is kept as evidence on the attempt.
            log.info("item %s: %s", item_id, exc)
            _schedule(item_id=item_id, next_check_at=None)
    else:
        looked: dict[str, Any] | None = None
        if item.state == S.UNCERTAIN:
            # An uncertain item keeps what each look found (a status check's answer, say), so a
            # reviewer sees the latest answer and why it did not settle the item.
            looked = {"last_look": evidence}
            if "uncertain_because" in plan.evidence:
                looked["uncertain_because"] = plan.evidence["uncertain_because"]
        _schedule(item_id=item_id, next_check_at=plan.next_check_at, progress=progress, evidence=looked)
    return Result(item_id, action, str(observation.seen), plan.to_state or item.state)


def item_observe(
    *, item_id: int, observation: Observation, action: str, actor: str, detail: dict[str, Any] | None = None
) -> Result:
    """Record what an agent-side owner of the work saw (it cancelled and read back through its own
    session, say) exactly as a reconciler's pass is recorded: an attempt row, then the engine.
    `detail`: mechanism facts the owner records with it (that it is letting its session go, say),
    merged into the item in the same transaction."""
    now = timezone.now()
    # One transaction, so nobody reads the item between the owner's two writes: finding it settled
    # by its owner with the session not yet let go, a reconciler would take the owner for dead.
    # Nothing here calls out; the ledger writes within nest as savepoints.
    with transaction.atomic():
        item = WorkItem.objects.get(pk=item_id)
        mechanism = registry.get(item.mechanism)
        attempt = CancellationAttempt.objects.create(item=item, mechanism=mechanism.name, action=action, sent_at=now)
        result = attempt_apply(item, mechanism, attempt, observation, action=action, actor=actor, now=now)
        if detail:
            item_record_detail(item_id=item_id, detail=detail, actor=actor)
    return result


@dataclass(frozen=True)
class Decision:
    plan: engine.Plan
    progress: dict[str, Any]  # the item's evidence["reconcile"] after this pass
    evidence: dict[str, Any]  # what this pass saw, for the item and its event


def decide(
    *, item: WorkItem, mechanism: Mechanism, observation: Observation, now: datetime, action: str, attempt_id: int
) -> Decision:
    """The engine's plan for `item` as read, with the progress and evidence to record."""
    progress: dict[str, Any] = dict(item.evidence.get("reconcile") or {})
    since = item.cancel_requested_at or _parse(progress.get("since")) or now
    progress.setdefault("since", since.isoformat())
    facts = engine.ItemFacts(
        state=item.state,
        cancel_requested=item.cancel_requested_at is not None,
        since=since,
        failures=int(progress.get("failures", 0)),
        cancelled_at=item.finished_at if item.state == S.CANCELLED else None,
        investigate_by_default_hours=float(settings.STOPDESK["INVESTIGATE_BY_HOURS"]),
        submitted_at=item.submitted_at,
    )
    plan = engine.decide(facts, observation, now, mechanism.settings)
    progress["failures"] = plan.failures
    if action == "cancel" and observation.cancel_sent:
        progress["cancel_answered"] = True
    evidence = {
        **plan.evidence,
        "mechanism": mechanism.name,
        "action": action,
        "attempt": attempt_id,
        "at": now.isoformat(),
        **({"detail": observation.detail} if observation.detail else {}),
    }
    return Decision(plan, progress, evidence)


def _attach(item_id: int, observation: Observation, actor: str) -> None:
    assert observation.record is not None
    item_attach_record(item_id=item_id, actor=actor, **dataclasses.asdict(observation.record))


def _late_result(*, item_id: int, reported: str, actor: str, outcome: str, evidence: dict[str, Any]) -> None:
    if reported in (S.COMPLETED, S.FAILED):
        # item_finish keeps the recorded state and turns the contradiction into an event + review.
        item_finish(item_id=item_id, succeeded=reported == S.COMPLETED, actor=actor, outcome=outcome, evidence=evidence)
        return
    item_late_result_record(item_id=item_id, reported=reported, actor=actor, outcome=outcome, evidence=evidence)


def _schedule(
    *,
    item_id: int,
    next_check_at: datetime | None,
    progress: dict[str, Any] | None = None,
    evidence: dict[str, Any] | None = None,
) -> None:
    """Set the next check (or none). Not a state change, so no event; the attempt row is the record."""
    items_schedule({item_id: Schedule(None, next_check_at, progress, evidence)})


def _parse(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value)


# --- many items --------------------------------------------------------------------------------


def items_reconcile_many(
    *, item_ids: list[int], concurrency: int, actor: str = ACTOR, now: datetime | None = None, claimed: bool = False
) -> list[Result]:
    """Reconcile items with `concurrency` threads. Each thread has its own database connection
    and closes it at its end. One item's failure is logged and never stops the others."""
    import queue
    import threading

    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for item_id in item_ids:
        work.put(item_id)
    results: list[Result] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            while True:
                try:
                    item_id = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    result = item_reconcile(item_id=item_id, actor=actor, now=now, claimed=claimed)
                except Exception:
                    log.exception("reconciling item %s failed", item_id)
                    result = Result(item_id, "error", "", "")
                with lock:
                    results.append(result)
        finally:
            connection.close()

    if concurrency <= 1 or len(item_ids) <= 1:
        for item_id in item_ids:
            try:
                results.append(item_reconcile(item_id=item_id, actor=actor, now=now, claimed=claimed))
            except Exception:
                log.exception("reconciling item %s failed", item_id)
                results.append(Result(item_id, "error", "", ""))
        return results
    threads = [threading.Thread(target=run, name=f"reconcile-{n}") for n in range(min(concurrency, len(item_ids)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# --- the sweep ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepReport:
    claimed: int
    errors: int
    flagged_overdue: int
    results: tuple[Result, ...]


def sweep_once(*, now: datetime | None = None, batch: int | None = None, concurrency: int | None = None) -> SweepReport:
    """One bounded pass: claim due items (SKIP LOCKED), reconcile them, flag overdue uncertain
    items. Tests call this directly; Celery beat calls it through `reconcile.sweep`."""
    now = now or timezone.now()
    cfg = settings.STOPDESK
    # A short lease, renewed while the pass works: a sweep that dies (its process killed, its
    # database connection cut) leaves its items due again within one lease.
    lease_s = lease_seconds()
    ids = items_claim_due(now=now, limit=batch or int(cfg.get("SWEEP_BATCH", 200)), hold_s=lease_s)
    with ClaimLease(item_ids=ids, now=now, until=now + timedelta(seconds=lease_s)):
        results = items_reconcile_many(
            item_ids=ids, concurrency=concurrency or int(cfg.get("SWEEP_CONCURRENCY", 8)), now=now, claimed=True
        )
    errors = [r for r in results if r.action == "error"]
    for result in errors:
        # Let the item come back later rather than wait for the claim to run out.
        _schedule(item_id=result.item_id, next_check_at=now + timedelta(seconds=60))
    flagged = items_flag_overdue(now=now)
    return SweepReport(claimed=len(ids), errors=len(errors), flagged_overdue=flagged, results=tuple(results))


OVERDUE_BATCH = 1000


def items_flag_overdue(*, now: datetime | None = None, limit: int = OVERDUE_BATCH) -> int:
    """Uncertain items past their investigate-by deadline go to the top of the review queue, at
    most `limit` a run. Only unflagged uncertain items are read (a partial index): the ones
    flagged before are not scanned again on every sweep."""
    now = now or timezone.now()
    due = WorkItem.objects.filter(state=S.UNCERTAIN, needs_review=False, investigate_by__lt=now)
    return items_move(  # type: ignore[return-value]
        where=Q(pk__in=due.order_by("investigate_by").values("id")[:limit]),
        from_states=(S.UNCERTAIN,),
        to_state=None,
        actor="system:sweep",
        kind="investigation_overdue",
        message="Uncertain past its investigate-by deadline; flagged for review.",
        sets={"needs_review": True},
    )


def attempt_apply(
    item: WorkItem,
    mechanism: Mechanism,
    attempt: CancellationAttempt,
    observation: Observation,
    *,
    action: str,
    actor: str,
    now: datetime,
) -> Result:
    """Close the attempt row with what was observed, then let the engine decide and apply it."""
    attempt_close(attempt.pk, observation)
    return item_apply(
        item_id=item.pk,
        mechanism=mechanism,
        observation=observation,
        actor=actor,
        now=now,
        action=action,
        attempt_id=attempt.pk,
    )
