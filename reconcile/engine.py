"""The reconciliation engine: (item facts, observation, clock, mechanism settings) -> plan.

Pure: no ORM, no I/O, no clock of its own. `reconcile.services` build the facts, ask an adapter
for an observation, and apply the plan through the ledger's transition functions.

The rules, in the order they apply:
- A final observation settles an in-flight item (completed, failed, cancelled).
- A final observation that contradicts a settled item is a late result: an event and a review
  flag, never an overwrite.
- After `cancelled` is recorded, a mechanism whose cancel has been seen to flip keeps watching
  for `recheck_after_cancelled_s`, at growing intervals (`watch_first_s`, then times `watch_growth`).
- Anything else waits, with backoff on failures, until the mechanism's deadline; then the item is
  `uncertain` with an investigate-by deadline.
- `unknowable` (no lookup exists and no answer will come) is `uncertain` at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from reconcile.mechanisms.base import MechanismSettings, Observation, Seen
from stopdesk.states import RECONCILABLE, TERMINAL, ItemState

S = ItemState

_SETTLING = {
    Seen.COMPLETED: S.COMPLETED,
    Seen.FAILED: S.FAILED,
    Seen.CANCELLED: S.CANCELLED,
    Seen.NO_EFFECT: S.CANCELLED,
}


@dataclass(frozen=True)
class ItemFacts:
    state: str
    cancel_requested: bool
    since: datetime  # when reconciliation of this item began (the cancel request, or the first check)
    failures: int = 0  # consecutive unanswered checks, for backoff
    cancelled_at: datetime | None = None  # when `cancelled` was recorded, for the flip watch
    investigate_by_default_hours: float = 24.0
    submitted_at: datetime | None = None  # when an external action was sent, if it was


@dataclass(frozen=True)
class Plan:
    to_state: str | None = None  # None: keep the state
    late_result: str | None = None  # a settled item contradicted: report this state for review
    next_check_at: datetime | None = None  # None: no further automatic check
    investigate_by: datetime | None = None
    outcome: str = ""
    reason: str = ""
    failures: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)


def decide(facts: ItemFacts, observation: Observation, now: datetime, cfg: MechanismSettings) -> Plan:
    seen = observation.seen
    evidence = {"seen": str(seen), "remote_status": observation.remote_status}
    if observation.message:
        evidence["message"] = observation.message
    deadline = facts.since + timedelta(seconds=cfg.deadline_s)
    failures = facts.failures + 1 if seen == Seen.UNREACHABLE else 0

    if facts.state in TERMINAL:
        return _settled(facts, observation, now, cfg, evidence)
    if facts.state not in RECONCILABLE:
        # Queued work never crossed the boundary: there is nothing to observe or reconcile.
        raise ValueError(f"The engine does not reconcile {facts.state} items.")

    if (
        seen == Seen.NO_EFFECT
        and facts.submitted_at is not None
        and now < facts.submitted_at + timedelta(seconds=cfg.call_timeout_s)
    ):
        # "Not found" while our own request may still be on its way is not yet an answer.
        seen = Seen.RUNNING
    if seen in _SETTLING:
        settles_to: str = _SETTLING[seen]
        if seen == Seen.NO_EFFECT and not facts.cancel_requested:
            settles_to = S.FAILED  # it did not take effect, and nobody asked it to stop
        watch = settles_to == S.CANCELLED and cfg.recheck_after_cancelled_s > 0
        return Plan(
            to_state=settles_to,
            next_check_at=now + timedelta(seconds=_watch_step(cfg)) if watch else None,
            outcome=_outcome(seen, observation, facts),
            reason=f"{seen} read back from the remote side",
            evidence=evidence,
        )

    if seen == Seen.UNKNOWABLE:
        why = observation.message or "No status lookup exists for this work."
        return _uncertain(facts, now, cfg, why, evidence, outcome=observation.outcome)

    if now >= deadline:
        why = {
            Seen.UNREACHABLE: "The remote side did not answer before the mechanism's deadline.",
            Seen.RUNNING: "Still running at the mechanism's deadline; the cancel did not take effect in time.",
            Seen.AWAITING_REPORT: "No result was reported before the mechanism's deadline.",
        }[seen]
        return _uncertain(facts, now, cfg, observation.if_deadline or why, evidence, failures=failures)

    if seen == Seen.UNREACHABLE:
        delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * (2 ** (failures - 1)))
    elif seen == Seen.AWAITING_REPORT:
        delay = cfg.deadline_s  # nothing to ask; look again at the deadline
    else:
        delay = cfg.recheck_interval_s
    # Never sleep past the deadline: the check at the deadline is the one that decides.
    next_check = min(now + timedelta(seconds=delay), deadline)
    to_state = (
        S.AWAITING_RECONCILIATION
        if facts.state == S.RUNNING and facts.cancel_requested and seen == Seen.AWAITING_REPORT
        else None
    )
    return Plan(
        to_state=to_state,
        next_check_at=next_check,
        reason=f"{seen}; checking again",
        failures=failures,
        outcome="waiting for its result to be reported" if to_state else "",
        evidence=evidence,
    )


def _settled(
    facts: ItemFacts, observation: Observation, now: datetime, cfg: MechanismSettings, evidence: dict[str, Any]
) -> Plan:
    """The item already has a final state; we are only watching it (a cancelled that may flip)."""
    seen = observation.seen
    reported = _SETTLING.get(seen)
    if reported is not None and reported != facts.state and not (facts.state == S.CANCELLED and seen == Seen.NO_EFFECT):
        return Plan(
            late_result=reported,
            outcome=f"reported {reported} after it was recorded {facts.state}",
            reason="late result",
            evidence=evidence,
        )
    if facts.state == S.CANCELLED and facts.cancelled_at is not None and cfg.recheck_after_cancelled_s > 0:
        window_ends = facts.cancelled_at + timedelta(seconds=cfg.recheck_after_cancelled_s)
        if now < window_ends:
            if seen == Seen.UNREACHABLE:
                next_at = min(now + timedelta(seconds=cfg.backoff_initial_s), window_ends)
            else:
                next_at = watch_next_at(facts.cancelled_at, now, cfg)
            return Plan(
                next_check_at=next_at,
                reason="watching a cancelled result",
                evidence=evidence,
            )
    return Plan(reason="settled", evidence=evidence)


def _uncertain(
    facts: ItemFacts,
    now: datetime,
    cfg: MechanismSettings,
    why: str,
    evidence: dict[str, Any],
    failures: int = 0,
    outcome: str = "",
) -> Plan:
    if facts.state == S.UNCERTAIN:
        # Already in the review queue; its investigate-by deadline stays where it was set. What
        # this look found is kept with the reason, so the item shows the latest answer.
        return Plan(reason=why, failures=failures, evidence={**evidence, "uncertain_because": why})
    hours = cfg.investigate_by_hours if cfg.investigate_by_hours is not None else facts.investigate_by_default_hours
    return Plan(
        to_state=S.UNCERTAIN,
        investigate_by=now + timedelta(hours=hours),
        outcome=outcome or "outcome unknown; investigate",
        reason=why,
        failures=failures,
        evidence={**evidence, "uncertain_because": why},
    )


def _watch_step(cfg: MechanismSettings) -> float:
    """The first interval of the watch after `cancelled`."""
    first = cfg.watch_first_s
    if first is None:
        first = min(cfg.recheck_interval_s, cfg.recheck_after_cancelled_s / 3)
    return max(0.001, first)


def watch_next_at(cancelled_at: datetime, now: datetime, cfg: MechanismSettings) -> datetime:
    """The next read-back of a watched `cancelled`: the first point of the growing schedule
    (first, first + first*g, ...) after `now`, counted from when `cancelled` was recorded, and
    never past the window. From the recorded time, not from the last check, so a late or missed
    sweep does not push the whole schedule back."""
    window = cfg.recheck_after_cancelled_s
    elapsed = (now - cancelled_at).total_seconds()
    step = _watch_step(cfg)
    point = step
    while point <= elapsed and point < window:
        step *= max(1.0, cfg.watch_growth)
        point += step
    return cancelled_at + timedelta(seconds=min(point, window))


def _outcome(seen: Seen, observation: Observation, facts: ItemFacts) -> str:
    if observation.outcome:
        return observation.outcome
    if seen == Seen.CANCELLED:
        return "cancelled; confirmed by read-back"
    if seen == Seen.NO_EFFECT:
        return observation.message or (
            "stopped; it had no effect" if facts.cancel_requested else "it did not take effect"
        )
    if seen == Seen.COMPLETED and facts.cancel_requested:
        return "completed anyway; the cancel did not take effect"
    if seen == Seen.FAILED:
        return f"failed ({observation.remote_status})" if observation.remote_status else "failed"
    return str(seen)
