"""Work-item states and the moves allowed between them, written as data."""

from django.db import models


class ItemState(models.TextChoices):
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


class Kind(models.TextChoices):
    MODEL_REQUEST = "model_request", "Model request"
    LOCAL_WORKER = "local_worker", "Local worker"
    REMOTE_TOOL = "remote_tool", "Remote tool"
    EXTERNAL_OPERATION = "external_operation", "External operation"


class Effect(models.TextChoices):
    CREATED = "created", "created"
    UPDATED = "updated", "updated"
    SENT = "sent", "sent"
    DELETED = "deleted", "deleted"
    ARCHIVED = "archived", "archived"


class DeliveryState(models.TextChoices):
    """A notification's delivery to one email address or webhook endpoint (stopdesk/notify)."""

    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    RETRYING = "retrying", "Retrying"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"
