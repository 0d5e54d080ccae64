"""What notifies, whom by default, and the topic of an audit event (pure: no database)."""

from __future__ import annotations

from django.db import models

from stopdesk.states import ItemState


class Topic(models.TextChoices):
    ITEM_UNCERTAIN = "item_uncertain", "An item became uncertain"
    INVESTIGATE_NEAR = "investigate_near", "An investigate-by deadline is near"
    INVESTIGATE_PASSED = "investigate_passed", "An investigate-by deadline passed"
    LATE_RESULT = "late_result", "A late result contradicts a recorded outcome"
    COMPENSATION_PROPOSED = "compensation_proposed", "A compensation waits for approval"
    COMPENSATION_ESCALATED = "compensation_escalated", "A compensation was escalated"
    COMPENSATION_FAILED = "compensation_failed", "A compensation failed"
    STOP_UNSETTLED = "stop_unsettled", "A stop has not settled in time"
    STOP_REQUESTED = "stop_requested", "Stop was pressed (the task, its runtime and the tools in flight)"
    TASK_DIGEST = "task_digest", "A digest of one task's item alerts"
    AUDIT_ANCHOR = "audit_anchor", "The audit chain's heads, signed (for a receiver that keeps them)"


T = Topic
# Facts about single items: a burst of them (a Stop with 150 unknowns) reaches a subscriber as a
# digest per task (notify/digest.py); one message per item only for those who ask (`per_item`).
DIGESTED = frozenset({T.ITEM_UNCERTAIN, T.LATE_RESULT, T.INVESTIGATE_NEAR, T.INVESTIGATE_PASSED})
# What a person chooses among by email (a digest goes to whoever takes any topic it gathers; the
# audit chain's signed heads are for a webhook receiver that keeps them).
CHOOSABLE = tuple(t for t in Topic if t not in (T.TASK_DIGEST, T.AUDIT_ANCHOR))
# Topics only for those who name them: an endpoint whose topics are empty (all) does not get them,
# nor does anyone by their role. Stop's credential hook is a receiver built for it (it revokes keys),
# and every other subscriber keeps the messages it had. The audit chain's signed heads come with
# every seal, for a receiver that keeps them outside the database.
NAMED_ONLY = frozenset({T.STOP_REQUESTED, T.AUDIT_ANCHOR})
# Email topics a person gets when they have not chosen (by role: the Django group names).
ROLE_DEFAULTS: dict[str, frozenset[str]] = {
    "reviewers": frozenset(
        {
            T.ITEM_UNCERTAIN,
            T.INVESTIGATE_NEAR,
            T.INVESTIGATE_PASSED,
            T.LATE_RESULT,
            T.COMPENSATION_ESCALATED,
            T.COMPENSATION_FAILED,
            T.STOP_UNSETTLED,
        }
    ),
    "approvers": frozenset({T.COMPENSATION_PROPOSED, T.COMPENSATION_ESCALATED, T.COMPENSATION_FAILED}),
    "operators": frozenset({T.STOP_UNSETTLED}),
}
# Superusers hear about what nobody else may be watching.
ADMIN_DEFAULTS = frozenset({T.INVESTIGATE_PASSED, T.COMPENSATION_FAILED, T.STOP_UNSETTLED})

# Compensation events by their kind (reconcile/services/compensation.py names them).
_COMPENSATION_KINDS = {
    "compensation_proposed": T.COMPENSATION_PROPOSED,
    "compensation_escalated": T.COMPENSATION_ESCALATED,
    "compensation_stale": T.COMPENSATION_ESCALATED,  # the record changed: escalated, never forced
    "compensation_interrupted": T.COMPENSATION_ESCALATED,
    "compensation_failed": T.COMPENSATION_FAILED,
}


def topic_for(*, kind: str, from_state: str, to_state: str) -> str | None:
    """The topic an audit event notifies under, or None. Time-based topics (deadline near or
    passed, stop not settled) come from the beat job, not from events."""
    if kind in _COMPENSATION_KINDS:
        return _COMPENSATION_KINDS[kind]
    if kind == "late_result":
        return T.LATE_RESULT
    if to_state == ItemState.UNCERTAIN and from_state != ItemState.UNCERTAIN:
        return T.ITEM_UNCERTAIN
    return None
