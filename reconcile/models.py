"""Compensation proposals and drill results. A reversal is new work, approved on its own."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from stopdesk.models import ExternalRecord, WorkItem
from stopdesk.states import CompensationState


class Compensation(models.Model):
    external_record = models.ForeignKey(ExternalRecord, on_delete=models.PROTECT, related_name="compensations")
    action = models.CharField(max_length=64, help_text='e.g. "archive"; "report_only" for irreversible effects.')
    expected_version = models.CharField(max_length=200)
    note = models.TextField(blank=True)
    state = models.CharField(max_length=16, choices=CompensationState.choices, default=CompensationState.PROPOSED)
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    proposed_at = models.DateTimeField(default=timezone.now)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    observed_version = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    # Review decisions (reconcile/services/compensation.py writes them, with an audit event each).
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True, help_text="When it was rejected or escalated.")
    reason = models.TextField(blank=True, help_text="Why it was rejected or escalated.")
    error = models.TextField(blank=True, help_text="What went wrong when it ran, if it failed.")

    class Meta:
        permissions = [
            ("propose_compensation", "Can propose a compensation"),
            ("approve_compensation", "Can approve or reject a compensation"),
        ]
        indexes = [models.Index(fields=["state", "proposed_at"])]

    def __str__(self) -> str:
        return f"{self.action} {self.external_record} ({self.state})"


class Escalation(models.Model):
    """An item or a compensation waiting on a person's decision: a reviewer handed it to a named
    person, or stopdesk escalated a compensation itself (the record changed under it, or its worker
    was lost mid-run; `by` is empty). Open until the item or compensation is decided: the review
    queue and the admin count the same open rows."""

    item = models.ForeignKey(WorkItem, null=True, blank=True, on_delete=models.PROTECT, related_name="escalations")
    compensation = models.ForeignKey(
        Compensation, null=True, blank=True, on_delete=models.PROTECT, related_name="escalations"
    )
    to = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Empty: any approver.",
    )
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Empty: stopdesk escalated it itself.",
    )
    reason = models.TextField()
    at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True, help_text="Set when the item or compensation was decided.")

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["closed_at", "at"])]

    def __str__(self) -> str:
        return f"Escalation to {self.to or 'the approvers'} ({'closed' if self.closed_at else 'open'})"


class RecordReading(models.Model):
    """What stopdesk saw when it read an external record through its adapter. Written twice: the
    intent (asked, no answer yet) before the call and the answer after it, each committed on its
    own, so a read that never returns still shows that it was asked for."""

    external_record = models.ForeignKey(ExternalRecord, on_delete=models.PROTECT, related_name="readings")
    compensation = models.ForeignKey(
        Compensation, null=True, blank=True, on_delete=models.PROTECT, related_name="readings"
    )
    actor = models.CharField(max_length=200, help_text="Who asked: user:NAME or system:compensation.")
    requested_at = models.DateTimeField(default=timezone.now)
    answered_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True, help_text="Empty while the read is under way.")
    version = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=64, blank=True, help_text='The record\'s own status ("active", "archived").')
    fields = models.JSONField(default=dict, blank=True, help_text="The record's fields as the system answered them.")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["external_record", "requested_at"], name="reading_per_record")]

    def __str__(self) -> str:
        return f"Reading of {self.external_record} ({self.version or self.error or 'pending'})"


class RecordDecisionKind(models.TextChoices):
    ACCEPTED = "accepted", "Accepted as is"
    FLAGGED = "flagged", "Put on the reversal list"


class RecordDecision(models.Model):
    """One person's word on a completed effect, without a compensation: accept it as it is, or put
    an effect completed before Stop on the reversal list."""

    external_record = models.ForeignKey(ExternalRecord, on_delete=models.PROTECT, related_name="decisions")
    kind = models.CharField(max_length=16, choices=RecordDecisionKind.choices)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(default=timezone.now)
    note = models.TextField(blank=True)
    compensation = models.ForeignKey(
        Compensation,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The escalated compensation this decision closed, if any.",
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["external_record", "kind"], name="decision_per_record")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.external_record}"


class DrillRun(models.Model):
    """One run of `manage.py stopdrill`: the table it printed, kept."""

    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    target = models.CharField(max_length=64, default="sandbox")
    passed = models.BooleanField(null=True)
    results = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"Drill run {self.pk} on {self.target}"


class DrillResult(models.Model):
    run = models.ForeignKey(DrillRun, on_delete=models.CASCADE, related_name="rows")
    drill = models.CharField(max_length=64)
    mechanism = models.CharField(max_length=32)
    expected = models.TextField()
    observed = models.TextField()
    passed = models.BooleanField()
    items = models.JSONField(default=list, blank=True)
    task = models.ForeignKey("stopdesk.Task", null=True, blank=True, on_delete=models.SET_NULL)
    related_item = models.ForeignKey(WorkItem, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"{self.drill} on {self.mechanism}: {'pass' if self.passed else 'FAIL'}"


class ProviderWebhook(models.Model):
    """One webhook delivery a provider sent (OpenAI's `response.*` events), kept by its
    `webhook-id` so a redelivery is known as one, also after a restart. A delivery is only a
    wake-up: it names the work (`handle`, a response id) and nothing it says is recorded as the
    work's outcome; the read-back it asks for is (`reconcile.services.webhooks`)."""

    provider = models.CharField(max_length=32)
    webhook_id = models.CharField(max_length=200, help_text="The delivery's webhook-id header.")
    event_type = models.CharField(max_length=64)
    handle = models.CharField(max_length=200, db_index=True, help_text="The work it names (a response id).")
    received_at = models.DateTimeField(default=timezone.now)
    woke = models.PositiveIntegerField(default=0, help_text="Items it asked to read back when it arrived.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "webhook_id"], name="webhook_once")]

    def __str__(self) -> str:
        return f"{self.provider} {self.event_type} for {self.handle}"
