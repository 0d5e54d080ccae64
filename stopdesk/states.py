"""Work-item states and the moves allowed between them, written as data.

Plain Python, no Django: the reconciliation engine and the adapters name states without loading
Django. `Choices` offers what Django's TextChoices does here (`values`, `choices`, `label`), so the
models use these classes as their field choices.
"""

from __future__ import annotations

import enum
from typing import Self


class _ChoicesType(enum.EnumType):
    @property
    def values(cls) -> list[str]:
        return [member.value for member in cls]  # type: ignore[var-annotated]

    @property
    def choices(cls) -> list[tuple[str, str]]:
        return [(member.value, member.label) for member in cls]  # type: ignore[var-annotated]


class Choices(enum.StrEnum, metaclass=_ChoicesType):
    """A string enum whose members carry a human label: `QUEUED = "queued", "Queued"`."""

    _value_: str
    label: str
    do_not_call_in_templates = enum.nonmember(True)

    def __new__(cls, value: str, label: str = "") -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label or value
        return member


class ItemState(Choices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    AWAITING_RECONCILIATION = "awaiting_reconciliation", "Awaiting reconciliation"
    UNCERTAIN = "uncertain", "Uncertain"


S = ItemState

TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.AWAITING_RECONCILIATION, S.UNCERTAIN}),
    S.AWAITING_RECONCILIATION: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.UNCERTAIN}),
    # An uncertain item leaves only through a reviewer's resolution or a reconciled fact.
    S.UNCERTAIN: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

# Each state's role, as data. Every part of stopdesk takes its sets from here, and
# tests/ledger/test_states_known.py fails when a state is missing from any part.
TERMINAL = frozenset(s for s, moves in TRANSITIONS.items() if not moves)
# Never crossed the boundary: nothing can have happened anywhere else.
UNSTARTED = frozenset({S.QUEUED})
# Crossed the boundary and not settled: work that may have had effects; Stop cancels it through
# its mechanism and reconciliation reads back what happened.
IN_FLIGHT = frozenset({S.RUNNING, S.AWAITING_RECONCILIATION})
# Settled: nothing more will happen without a person. Uncertain counts, because it has a deadline
# and a place in the review queue.
SETTLED = TERMINAL | {S.UNCERTAIN}
UNSETTLED = UNSTARTED | IN_FLIGHT
# What an observation may still move (the reconciliation engine decides these); a terminal item
# is only watched, for a late result.
RECONCILABLE = IN_FLIGHT | {S.UNCERTAIN}
# What the reconcile sweep picks up when due: everything that crossed the boundary.
SWEPT = frozenset(ItemState) - UNSTARTED

# The roles partition the states: each state is exactly one of unstarted, in flight, settled.
if frozenset(ItemState) != UNSTARTED | IN_FLIGHT | SETTLED or (
    UNSTARTED & IN_FLIGHT or UNSTARTED & SETTLED or IN_FLIGHT & SETTLED
):
    raise RuntimeError("Each item state must have exactly one role: unstarted, in flight or settled.")


def can_move(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS[from_state]


class Kind(Choices):
    MODEL_REQUEST = "model_request", "Model request"
    LOCAL_WORKER = "local_worker", "Local worker"
    REMOTE_TOOL = "remote_tool", "Remote tool"
    EXTERNAL_OPERATION = "external_operation", "External operation"


class Effect(Choices):
    CREATED = "created", "created"
    UPDATED = "updated", "updated"
    SENT = "sent", "sent"
    DELETED = "deleted", "deleted"
    ARCHIVED = "archived", "archived"


class DeliveryState(Choices):
    """A notification's delivery to one email address or webhook endpoint (stopdesk/notify)."""

    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    RETRYING = "retrying", "Retrying"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


D = DeliveryState

# Claimed (one more attempt) from what is due, from a send whose claim ran out, and, when a person
# re-sends, from delivered or failed; the claim's holder records the result.
DELIVERY_TRANSITIONS: dict[str, frozenset[str]] = {
    D.PENDING: frozenset({D.SENDING}),
    D.RETRYING: frozenset({D.SENDING}),
    D.SENDING: frozenset({D.SENDING, D.DELIVERED, D.RETRYING, D.FAILED}),
    D.DELIVERED: frozenset({D.SENDING}),
    D.FAILED: frozenset({D.SENDING}),
}


class CompensationState(Choices):
    """A proposed reversal of an external effect (reconcile/services/compensation.py moves it)."""

    PROPOSED = "proposed", "Proposed"
    APPROVED = "approved", "Approved"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    ESCALATED = "escalated", "Escalated"
    REJECTED = "rejected", "Rejected"


C = CompensationState

COMPENSATION_TRANSITIONS: dict[str, frozenset[str]] = {
    C.PROPOSED: frozenset({C.APPROVED, C.REJECTED, C.ESCALATED}),
    C.APPROVED: frozenset({C.RUNNING}),
    C.RUNNING: frozenset({C.DONE, C.FAILED, C.ESCALATED}),
    C.ESCALATED: frozenset({C.REJECTED, C.APPROVED}),
    C.DONE: frozenset(),
    C.FAILED: frozenset(),
    C.REJECTED: frozenset(),
}
