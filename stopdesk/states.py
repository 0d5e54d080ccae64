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

TERMINAL = frozenset(s for s, moves in TRANSITIONS.items() if not moves)
# Settled: nothing more will happen without a person. Uncertain counts, because it has a deadline
# and a place in the review queue.
SETTLED = TERMINAL | {S.UNCERTAIN}
# Crossed the boundary: work that may have had effects and must be reconciled after a stop.
IN_FLIGHT = frozenset({S.RUNNING, S.AWAITING_RECONCILIATION})


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
