"""The outbox, its deliveries, webhook endpoints, email choices and heartbeats."""

from __future__ import annotations

import base64
import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from stopdesk.notify.topics import NAMED_ONLY, Topic
from stopdesk.states import DeliveryState

D = DeliveryState


def new_webhook_secret() -> str:
    # Standard Webhooks secrets are base64 with a whsec_ prefix; verifiers strip the prefix and
    # base64-decode the rest, so a secret without it would be read differently by some of them.
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class Notification(models.Model):
    """One row per notifying fact, written in the transaction of the event that causes it."""

    topic = models.CharField(max_length=40, choices=Topic.choices)
    # Exactly once per fact: an event id, or (for time-based topics) the item and its deadline.
    dedupe_key = models.CharField(max_length=200, unique=True)
    event_id = models.BigIntegerField(null=True, blank=True)
    task_id = models.BigIntegerField(null=True, blank=True)
    item_id = models.BigIntegerField(null=True, blank=True)
    title = models.CharField(max_length=300)
    body = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Set once its deliveries (one per recipient and endpoint) exist.
    expanded_at = models.DateTimeField(null=True, blank=True)
    # The digest that counts this fact (a per-item topic of a task), exactly one.
    digest = models.ForeignKey("Digest", null=True, blank=True, on_delete=models.PROTECT, related_name="facts")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["created_at"], condition=Q(expanded_at__isnull=True), name="notify_unexpanded"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}: {self.title}"

    @property
    def message_id(self) -> str:
        """The `webhook-id`: the same on every retry, so a receiver can deduplicate."""
        return f"msg_stopdesk_{self.pk}"


class WebhookEndpoint(models.Model):
    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100, default=new_webhook_secret, help_text="whsec_... (Standard Webhooks)")
    topics = models.JSONField(
        default=list,
        blank=True,
        help_text="Topics to send; empty means all but stop_requested and audit_anchor, which are sent only if named.",
    )
    per_item = models.BooleanField(
        default=False,
        help_text="Also one message per item (uncertain, late result, deadline); otherwise a digest per task.",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name

    def wants(self, topics: frozenset[str], *, per_item: bool = False) -> bool:
        """Whether it takes a notification for any of `topics`; a per-item alert only if it asked,
        and a topic sent only to those who name it (`NAMED_ONLY`) only if it names it."""
        taken = bool(topics & set(self.topics)) or (not self.topics and bool(topics - NAMED_ONLY))
        return self.active and taken and (self.per_item or not per_item)


class Delivery(models.Model):
    """One notification to one email address or one endpoint; the unit of retry."""

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=16, choices=[("email", "email"), ("webhook", "webhook")])
    endpoint = models.ForeignKey(WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE)
    recipient = models.CharField(max_length=254, blank=True, help_text="Email address.")
    # "endpoint:<id>" or "user:<id>": at most one delivery per notification and target.
    target = models.CharField(max_length=100)
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=D.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveIntegerField(null=True, blank=True, help_text="HTTP status of the last attempt.")
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # A sender holds the delivery until then; a sender killed mid-send leaves it to expire.
    claimed_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["notification", "target"], name="notify_delivery_once_per_target")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state__in=[D.PENDING, D.RETRYING, D.SENDING]),
                name="notify_delivery_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.target} for notification {self.notification_id} ({self.state})"


class DeliveryAttempt(models.Model):
    """The delivery log: every try, with what came back."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    at = models.DateTimeField(default=timezone.now)
    status = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    ms = models.FloatField(default=0.0)
    manual = models.BooleanField(default=False, help_text="Re-sent by a person.")

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"attempt at {self.at:%H:%M:%S}: {self.status or self.error}"


class EmailPreference(models.Model):
    """A person's choice of topics by email; without a row, their role's defaults apply."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    topics = models.JSONField(default=list, blank=True)
    per_item = models.BooleanField(default=False, help_text="Also one email per item, besides the task's digest.")

    def __str__(self) -> str:
        return f"email topics of user {self.user_id}"


class Digest(models.Model):
    """The per-item facts of one task gathered into few messages: the first after a window, then
    one when the task's items have settled (and, while they have not, at most one update per
    repeat interval). The facts are the outbox rows pointing here; `counted_through` is the last
    one a written message counted, so a fact is counted in exactly one message."""

    task_id = models.BigIntegerField()
    opened_at = models.DateTimeField(default=timezone.now)
    # When the sweep next looks at it.
    due_at = models.DateTimeField()
    messages = models.PositiveIntegerField(default=0)
    counted_through = models.BigIntegerField(default=0)
    last_message_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["task_id"], condition=Q(closed_at__isnull=True), name="notify_digest_one_open_per_task"
            )
        ]
        indexes = [models.Index(fields=["due_at"], condition=Q(closed_at__isnull=True), name="notify_digest_due")]

    def __str__(self) -> str:
        return f"digest {self.pk} of task {self.task_id}"


class Heartbeat(models.Model):
    """Last sign of life of a process kind (worker, beat), and the cursors and tallies of the
    periodic jobs that feed /metrics and the time-based notifications."""

    name = models.CharField(max_length=64, primary_key=True)
    at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.name} at {self.at}"
