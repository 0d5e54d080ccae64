"""Compensations, escalations and drills in the admin: read-only, the services decide."""

from __future__ import annotations

from django.contrib import admin

from reconcile.models import (
    Compensation,
    DrillResult,
    DrillRun,
    Escalation,
    ProviderWebhook,
    RecordDecision,
    RecordReading,
)
from stopdesk.admin_dates import DateRangeFilter, date_range
from stopdesk.admin_export import ExportMixin
from stopdesk.admin_scale import ReadOnlyAdmin, id_search, recent_values
from stopdesk.exports import columns


@admin.register(Compensation)
class CompensationAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = (
        "id",
        "action",
        "external_record",
        "state",
        "expected_version",
        "observed_version",
        "proposed_by",
        "approved_by",
        "rejected_by",
        "proposed_at",
        "finished_at",
    )
    list_filter = (
        "state",
        recent_values("action", "action"),
        recent_values("external_record__system", "system"),
        ("proposed_at", DateRangeFilter),
    )
    search_fields = ("=id",)
    search_help_text = "A compensation id, or a record id (exactly)."
    list_select_related = ("external_record", "proposed_by", "approved_by", "rejected_by")
    export_columns = columns(
        "id",
        "external_record_id",
        ("system", "external_record__system"),
        ("record_id", "external_record__record_id"),
        ("item_id", "external_record__item_id"),
        ("task_id", "external_record__item__task_id"),
        "action",
        "state",
        "expected_version",
        "observed_version",
        ("proposed_by", "proposed_by__username"),
        "proposed_at",
        ("approved_by", "approved_by__username"),
        "approved_at",
        ("rejected_by", "rejected_by__username"),
        ("escalated_to", "escalated_to__username"),
        "decided_at",
        "started_at",
        "finished_at",
        "note",
        "reason",
        "error",
        "result",
    )

    def get_search_results(self, request, queryset, search_term):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("id",), ("external_record__record_id",))


class EscalationStatus(admin.SimpleListFilter):
    """Open: waiting on a person, as the review queue counts them. Closed: decided."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):  # type: ignore[no-untyped-def]
        return [("open", "Open (waiting on a person)"), ("closed", "Closed (decided)")]

    def queryset(self, request, queryset):  # type: ignore[no-untyped-def]
        if self.value() in ("open", "closed"):
            return queryset.filter(closed_at__isnull=self.value() == "open")
        return queryset


@admin.register(Escalation)
class EscalationAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = ("id", "item", "compensation", "to_display", "by_display", "reason", "at", "closed_at")
    list_filter = (EscalationStatus, "to", ("at", date_range("time")))
    search_fields = ("reason", "to__username", "by__username")
    list_select_related = ("item", "compensation", "to", "by")
    export_columns = columns(
        "id",
        "item_id",
        "compensation_id",
        ("to", "to__username"),
        ("by", "by__username"),
        "reason",
        "at",
        "closed_at",
    )

    @admin.display(description="To", ordering="to")
    def to_display(self, escalation: Escalation) -> str:
        return escalation.to.get_username() if escalation.to else "any approver"

    @admin.display(description="By", ordering="by")
    def by_display(self, escalation: Escalation) -> str:
        return escalation.by.get_username() if escalation.by else "stopdesk"


@admin.register(RecordReading)
class RecordReadingAdmin(ExportMixin, ReadOnlyAdmin):
    """Every read of an external record's version: the intent first, then what the system said."""

    list_display = ("id", "external_record", "compensation", "actor", "requested_at", "answered_at", "ok", "version")
    list_filter = ("ok", recent_values("external_record__system", "system"), ("requested_at", DateRangeFilter))
    search_fields = ("=id",)
    search_help_text = "A reading id, or a record id (exactly)."
    list_select_related = ("external_record",)
    export_columns = columns(
        "id",
        "external_record_id",
        ("system", "external_record__system"),
        ("record_id", "external_record__record_id"),
        "compensation_id",
        "actor",
        "requested_at",
        "answered_at",
        "ok",
        "version",
        "status",
        "fields",
        "error",
    )

    def get_search_results(self, request, queryset, search_term):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("id",), ("external_record__record_id",))


@admin.register(RecordDecision)
class RecordDecisionAdmin(ExportMixin, ReadOnlyAdmin):
    """A reviewer's decision on a completed effect: accepted as it is, or put on the reversal list."""

    list_display = ("id", "external_record", "kind", "by", "at", "compensation", "note")
    list_filter = ("kind", recent_values("external_record__system", "system"), ("at", DateRangeFilter))
    search_fields = ("=id",)
    search_help_text = "A decision id, or a record id (exactly)."
    list_select_related = ("external_record", "by")
    export_columns = columns(
        "id",
        "external_record_id",
        ("system", "external_record__system"),
        ("record_id", "external_record__record_id"),
        "kind",
        ("by", "by__username"),
        "at",
        "compensation_id",
        "note",
    )

    def get_search_results(self, request, queryset, search_term):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("id",), ("external_record__record_id",))


class DrillResultInline(admin.TabularInline):
    model = DrillResult
    extra = 0
    can_delete = False
    fields = ("drill", "mechanism", "expected", "observed", "passed", "task")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(ProviderWebhook)
class ProviderWebhookAdmin(ReadOnlyAdmin):
    """Each webhook delivery kept once by its id: what it named and how many items it woke. The
    read-back it asked for is the item's cancellation attempt, by `system:webhook`."""

    list_display = ("id", "received_at", "provider", "event_type", "handle", "woke")
    list_filter = ("provider", "event_type")
    search_fields = ("handle", "webhook_id")


@admin.register(DrillRun)
class DrillRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "started_at", "finished_at", "target", "passed")
    list_filter = ("passed", recent_values("target", "target"))
    inlines = (DrillResultInline,)


@admin.register(DrillResult)
class DrillResultAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "drill", "mechanism", "passed")
    list_filter = ("passed", recent_values("mechanism", "mechanism"), recent_values("drill", "drill"))
    search_fields = ("drill", "observed", "expected")
