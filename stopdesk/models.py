"""The ledger: what an agent task scheduled, what Stop did about it, and the audit trail.

States are assigned only by the service functions in `stopdesk.services`; nothing else writes them.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.utils import timezone

from stopdesk.states import Effect, ItemState, Kind


class Runtime(models.Model):
    """An agent runtime that talks to the HTTP API with its own bearer token."""

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to tell tokens apart.")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def hash_token(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def issue_token(self) -> str:
        """Set a new token and return it; only its hash is stored, so it is shown once."""
        token = "sd_" + secrets.token_urlsafe(32)
        self.token_hash = self.hash_token(token)
        self.token_prefix = token[:10]
        return token

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Task(models.Model):
    title = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    runtime = models.ForeignKey(Runtime, null=True, blank=True, on_delete=models.PROTECT, related_name="tasks")
    created_at = models.DateTimeField(default=timezone.now)
    # The boundary reads this column (denormalised from StopRequest) in the same statement that
    # starts an item; it is set exactly once.
    stop_requested_at = models.DateTimeField(null=True, blank=True, db_index=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    # Set once, when the runtime says the task is over or it stayed idle past the timeout
    # (stopdesk.services.closing): from then on no new work can be registered. Until then a task
    # whose items have all settled is still open, and still offers Stop.
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Serves the task list and the admin's ordering (-created_at, -id) with a LIMIT.
            models.Index(fields=["created_at", "id"], name="task_created"),
            # The settle sweep's candidates: tasks not settled yet, however long the history.
            models.Index(fields=["id"], condition=Q(settled_at__isnull=True), name="task_unsettled"),
            # The idle-close sweep's candidates: open tasks, by when they settled.
            models.Index(fields=["settled_at"], condition=Q(closed_at__isnull=True), name="task_open_settled"),
        ]

    def __str__(self) -> str:
        # With its id: several tasks often share a title (every demo run is "Invoice analysis").
        return f"#{self.pk} {self.title}"

    @property
    def is_stopped(self) -> bool:
        return self.stop_requested_at is not None

    @property
    def is_closed(self) -> bool:
        return self.closed_at is not None


# An item whose outcome is not known yet (the MCP gateway's retry gate holds an identical call).
OUTCOME_UNKNOWN_STATES = (ItemState.UNCERTAIN, ItemState.AWAITING_RECONCILIATION)


class WorkItem(models.Model):
    # Not indexed alone: the (task, state) index serves every lookup by task.
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="items", db_index=False)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    mechanism = models.CharField(max_length=32, default="manual", help_text="Which adapter can cancel or inspect it.")
    handle = models.CharField(max_length=200, blank=True, help_text="Response id, MCP request/task id, Celery id...")
    idempotency_key = models.CharField(max_length=200, blank=True)
    noun = models.CharField(max_length=40, default="item", help_text='What a person calls it: "draft", "record".')
    noun_plural = models.CharField(max_length=40, blank=True)
    label = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=32, choices=ItemState.choices, default=ItemState.QUEUED)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the external action crossed the boundary."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True)
    check_count = models.PositiveIntegerField(default=0)
    investigate_by = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=200, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    needs_review = models.BooleanField(default=False, help_text="A late or contradicting report arrived.")
    detail = models.JSONField(default=dict, blank=True, help_text="Mechanism-specific facts (tool annotations...).")

    class Meta:
        # Partial indexes: a queued item cancelled by Stop touches none of them, which keeps the
        # set-based cancel of 10,000 items cheap.
        indexes = [
            models.Index(fields=["task", "state"]),
            models.Index(fields=["lease_until"], condition=Q(state=ItemState.RUNNING.value), name="item_running_lease"),
            # The sweep's claim order (due time, then id) read straight off the index: ties in
            # next_check_at otherwise sort every tied row before the LIMIT.
            models.Index(
                fields=["next_check_at", "id"], condition=Q(next_check_at__isnull=False), name="item_next_check"
            ),
            # The review queue's order (deadline, then id) read straight off the index.
            models.Index(
                fields=["investigate_by", "id"],
                condition=Q(state=ItemState.UNCERTAIN.value),
                name="item_uncertain_deadline",
            ),
            # The review queue's oldest entry (min updated_at of the uncertain items), one probe.
            models.Index(
                fields=["updated_at"], condition=Q(state=ItemState.UNCERTAIN.value), name="item_uncertain_since"
            ),
            # The overdue sweep: unflagged uncertain items only, so flagged ones are not read again.
            models.Index(
                fields=["investigate_by"],
                condition=Q(state=ItemState.UNCERTAIN.value, needs_review=False),
                name="item_overdue_unflagged",
            ),
            # The admin's state filter with its newest-first order; without it a rare state walks
            # the whole primary key.
            models.Index(fields=["state", "id"], name="item_state"),
            # The review queue's late results (rare rows, in the order the queue shows them).
            models.Index(fields=["updated_at", "id"], condition=Q(needs_review=True), name="item_late_results"),
            # A provider's webhook names its work by handle (a response id): one probe per delivery.
            models.Index(fields=["handle"], condition=~Q(handle=""), name="item_handle"),
            # A client names its task through the MCP gateway by the gateway's own task id; after a
            # restart of the gateway that id is found here (stopdesk.gateway.recorded_tasks).
            models.Index(
                KT("detail__gateway__client_task_id"), condition=Q(mechanism="mcp"), name="item_gateway_client_task"
            ),
            # The MCP gateway's retry gate reads a task's identical calls still at work or not known
            # yet before each call is sent (stopdesk.gateway.retry_gate): a few rows, not every
            # identical call the session made (an agent may read the same thing a thousand times).
            models.Index(
                "task",
                KT("detail__gateway__arguments_sha256"),
                condition=Q(
                    mechanism="mcp",
                    state__in=[s.value for s in (ItemState.QUEUED, ItemState.RUNNING, *OUTCOME_UNKNOWN_STATES)],
                ),
                name="item_gateway_retry_held",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.noun} #{self.pk} ({self.state})"

    @property
    def plural(self) -> str:
        return self.noun_plural or pluralize(self.noun)

    @property
    def review_required(self) -> bool:
        """In the review queue: uncertain (its own section), or a late or contradicting report.
        This is what the API, the admin and the pages call needs_review."""
        return self.needs_review or self.state == ItemState.UNCERTAIN


def pluralize(noun: str) -> str:
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


class ExternalRecord(models.Model):
    """An effect in another system that crossed the boundary."""

    item = models.ForeignKey(WorkItem, on_delete=models.PROTECT, related_name="external_records")
    system = models.CharField(max_length=64)
    record_id = models.CharField(max_length=200)
    version = models.CharField(max_length=200, blank=True, help_text="ETag or revision seen when recorded.")
    effect = models.CharField(max_length=16, choices=Effect.choices)
    reversible = models.BooleanField(default=False)
    reversal = models.CharField(max_length=64, blank=True, help_text='How to reverse it, e.g. "archive".')
    link = models.URLField(max_length=500, blank=True)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # Unique per item, not globally: a global key let one runtime claim (and probe) ids that
        # another runtime's real effects then could not record.
        constraints = [models.UniqueConstraint(fields=["item", "system", "record_id"], name="external_record_per_item")]
        indexes = [
            models.Index(fields=["system", "record_id"], name="external_record_lookup"),
            # The review queue's reversals, newest first, and the admin's search by record id.
            models.Index(fields=["recorded_at", "id"], name="record_recorded"),
            models.Index(fields=["record_id"], name="record_id"),
        ]

    def __str__(self) -> str:
        return f"{self.system}:{self.record_id}@{self.version}"


class StopRequest(models.Model):
    """One per task. A second Stop is an event on this row, never a second request."""

    task = models.OneToOneField(Task, on_delete=models.PROTECT, related_name="stop_request")
    requested_at = models.DateTimeField()
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor = models.CharField(max_length=200, help_text="Who asked: user:NAME or runtime:NAME.")
    reason = models.TextField(blank=True)
    queued_cancelled = models.PositiveIntegerField(default=0)
    dispatched = models.PositiveIntegerField(default=0)
    fanout_done_at = models.DateTimeField(null=True, blank=True, help_text="Queued items cancelled and jobs queued.")
    duplicates = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"Stop of task {self.task_id}"


class CancellationAttempt(models.Model):
    """What we sent through which mechanism, and what came back."""

    item = models.ForeignKey(WorkItem, on_delete=models.PROTECT, related_name="attempts")
    mechanism = models.CharField(max_length=32)
    action = models.CharField(max_length=32, help_text="cancel, inspect, revoke...")
    sent_at = models.DateTimeField(default=timezone.now)
    answered_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True)
    observed_status = models.CharField(max_length=64, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["sent_at", "id"]
        indexes = [models.Index(fields=["sent_at", "id"], name="attempt_sent")]

    def __str__(self) -> str:
        return f"{self.action} via {self.mechanism} for item {self.item_id}"


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("Audit events are append-only.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("Audit events are append-only.")


class Event(models.Model):
    """Append-only audit row for every transition and decision.

    Database triggers (stopdesk.audit_db) refuse UPDATE, DELETE and TRUNCATE. After commit the
    sealer (stopdesk.services.audit_seal) gives each event its place (`seq`) and `hash` in its
    task's chain, the one update the triggers allow, so rewriting history is visible to
    `manage.py audit_verify` even for someone who can switch the triggers off.
    """

    # No foreign-key constraints: per-row referential checks doubled the cost of writing 10,000
    # events in one Stop. Tasks and items with events are never deleted: PROTECT here, and a
    # trigger on each table for raw SQL.
    at = models.DateTimeField(default=timezone.now)
    task = models.ForeignKey(
        Task,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="events",
        db_constraint=False,
        db_index=False,
    )
    item = models.ForeignKey(
        WorkItem, null=True, blank=True, on_delete=models.PROTECT, related_name="events", db_constraint=False
    )
    kind = models.CharField(max_length=40)
    actor = models.CharField(max_length=200)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    # 0 and empty until sealed; set once, by the sealer.
    seq = models.BigIntegerField(
        db_default=0, editable=False, help_text="Place in its task's chain, from 1 (0: not sealed yet)."
    )
    hash = models.CharField(
        max_length=64,
        db_default="",
        blank=True,
        editable=False,
        help_text="SHA-256 of this event and the previous one's hash.",
    )

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]
        # (task, at): a task's timeline. (at, id): the admin's list in time order, and the date
        # filter. (kind, at): the admin's kind filter.
        indexes = [
            models.Index(fields=["task", "at"]),
            models.Index(fields=["at", "id"], name="event_at"),
            models.Index(fields=["kind", "at"], name="event_kind_at"),
            # What the sealer reads: the events not sealed yet, in id order (a few at any moment).
            models.Index(fields=["id"], condition=models.Q(seq=0), name="event_unsealed"),
            # A task's items that were ever uncertain or awaiting reconciliation (the MCP gateway's
            # retry gate asks): a few events, not the task's whole history.
            models.Index(
                fields=["task"],
                condition=models.Q(to_state__in=[s.value for s in OUTCOME_UNKNOWN_STATES], item__isnull=False),
                name="event_task_unsettled",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("Audit events are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("Audit events are append-only.")


class EventChain(models.Model):
    """The head of each task's event chain (task 0: events without a task), kept by the sealer.

    Only the sealer moves it (one at a time, under a lock), so a chain never forks; an archive
    that moves old events out keeps its last link as `anchor_seq`/`anchor_hash`.
    """

    task_id = models.BigIntegerField(primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True)
    anchor_seq = models.BigIntegerField(default=0, help_text="Events up to here were archived.")
    anchor_hash = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"chain of task {self.task_id} at {self.seq}"


class ApiIdempotency(models.Model):
    """The first answer to an HTTP request that carried an Idempotency-Key, replayed on repeats."""

    runtime = models.ForeignKey(Runtime, on_delete=models.CASCADE)
    key = models.CharField(max_length=200)
    endpoint = models.CharField(max_length=200)
    status = models.PositiveSmallIntegerField()
    body = models.JSONField()
    # sha256 of the validated request: the same key with another body is refused, not replayed.
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["runtime", "key", "endpoint"], name="api_idempotency_unique")]
        verbose_name = "API idempotency key"
        verbose_name_plural = "API idempotency keys"

    def __str__(self) -> str:
        return f"{self.endpoint} {self.key}"


class GatewaySession(models.Model):
    """The task an MCP gateway session files its calls under, shared by every gateway process: a
    2026-07-28 client has no session and may reach any process behind a load balancer, and its
    calls must land on one task for one Stop to reach them all. `key` is a digest of who the
    session is (`stopdesk.gateway.sessions.Caller.key`); the newest open task for it is used."""

    key = models.CharField(max_length=64, db_index=True)
    task = models.OneToOneField(Task, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"gateway session of task {self.task_id}"
