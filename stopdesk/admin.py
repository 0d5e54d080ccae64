"""Audit in the Django admin. Ledger rows are read-only here: every write goes through
`stopdesk.services`, so the admin can look but not change. Audit events cannot be added, changed
or deleted by anyone, superusers included."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from stopdesk.admin_dates import DateRangeFilter, date_range
from stopdesk.admin_export import ExportMixin
from stopdesk.admin_scale import ReadOnlyAdmin, id_search, recent_values
from stopdesk.exports import columns
from stopdesk.models import (
    ApiIdempotency,
    CancellationAttempt,
    Event,
    EventChain,
    ExternalRecord,
    GatewaySession,
    Runtime,
    StopRequest,
    Task,
    WorkItem,
)
from stopdesk.paging import TimelinePaginator
from stopdesk.templatetags.stopdesk_pages import pretty_json


@admin.register(Task)
class TaskAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = (
        "id",
        "title",
        "owner",
        "runtime",
        "created_at",
        "stop_requested_at",
        "settled_at",
        "closed_at",
        "timeline_link",
    )
    list_filter = (
        ("stop_requested_at", admin.EmptyFieldListFilter),
        ("closed_at", admin.EmptyFieldListFilter),
        "runtime",
        ("created_at", DateRangeFilter),
    )
    search_fields = ("title", "=id")
    date_hierarchy = "created_at"
    list_select_related = ("owner", "runtime")
    export_columns = columns(
        "id",
        "title",
        ("owner", "owner__username"),
        ("runtime", "runtime__name"),
        "created_at",
        "stop_requested_at",
        "settled_at",
        "closed_at",
    )

    @admin.display(description="Timeline")
    def timeline_link(self, task: Task) -> str:
        return format_html('<a href="{}">timeline</a>', reverse("admin:stopdesk_task_timeline", args=[task.pk]))

    def get_urls(self) -> list[Any]:
        timeline = self.admin_site.admin_view(self.timeline_view)
        return [path("<int:task_id>/timeline/", timeline, name="stopdesk_task_timeline"), *super().get_urls()]

    def timeline_view(self, request: HttpRequest, task_id: int) -> HttpResponse:
        """Every event of one task in order: transitions, decisions, stops, compensation."""
        task = get_object_or_404(Task, pk=task_id)
        if not self.has_view_permission(request, task):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        oldest_first = request.GET.get("order") == "oldest"
        order = ("at", "id") if oldest_first else ("-at", "-id")
        events = Event.objects.filter(task=task).select_related("item").order_by(*order)
        kind = request.GET.get("kind", "")
        if kind:
            events = events.filter(kind=kind)
        page = TimelinePaginator(events, 200).get_page(request.GET.get("page"))
        kinds = Event.objects.filter(task=task).values_list("kind", flat=True).distinct().order_by("kind")
        chain = EventChain.objects.filter(task_id=task.pk).first()
        context = {
            # Events up to this place in the task's chain were archived with their month.
            "archived_through": chain.anchor_seq if chain else 0,
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Timeline of task #{task.pk}: {task.title}",
            "task": task,
            "page": page,
            "kinds": kinds,
            "kind": kind,
            "oldest_first": oldest_first,
        }
        return TemplateResponse(request, "admin/stopdesk/task/timeline.html", context)


class ExternalRecordInline(admin.TabularInline):
    model = ExternalRecord
    extra = 0
    can_delete = False
    fields = ("system", "record_id", "version", "effect", "reversible", "reversal", "link", "recorded_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(admin.TabularInline):
    model = CancellationAttempt
    extra = 0
    can_delete = False
    fields = ("sent_at", "mechanism", "action", "answered_at", "ok", "observed_status", "detail")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkItem)
class WorkItemAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = (
        "id",
        "task",
        "noun",
        "kind",
        "mechanism",
        "state",
        "handle",
        "investigate_by",
        "needs_review_display",
        "updated_at",
    )
    list_filter = (
        "state",
        "kind",
        recent_values("mechanism", "mechanism"),
        "needs_review",
        ("created_at", DateRangeFilter),
    )
    search_fields = ("=id",)
    search_help_text = "An item id or a task id."
    list_select_related = ("task",)
    raw_id_fields = ("task", "parent")
    inlines = (ExternalRecordInline, AttemptInline)
    export_columns = columns(
        "id",
        "task_id",
        "parent_id",
        "kind",
        "mechanism",
        "noun",
        "label",
        "state",
        "handle",
        "idempotency_key",
        "created_at",
        "started_at",
        "submitted_at",
        "finished_at",
        "updated_at",
        "investigate_by",
        "outcome",
        "needs_review",
        "evidence",
        "detail",
    )

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[WorkItem], search_term: str):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("id", "task_id"))

    @admin.display(description="Needs review", boolean=True)
    def needs_review_display(self, item: WorkItem) -> bool:
        # As the API and the review queue say it: uncertain items need review too.
        return item.review_required


@admin.register(ExternalRecord)
class ExternalRecordAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = ("id", "system", "record_id", "version", "effect", "reversible", "reversal", "item", "recorded_at")
    list_filter = (recent_values("system", "system"), "effect", "reversible", ("recorded_at", DateRangeFilter))
    export_columns = columns(
        "id",
        "item_id",
        ("task_id", "item__task_id"),
        "system",
        "record_id",
        "version",
        "effect",
        "reversible",
        "reversal",
        "link",
        "recorded_at",
    )
    search_fields = ("=record_id",)
    search_help_text = "A record id (exactly), or a record, item or task id."
    list_select_related = ("item",)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[ExternalRecord], search_term: str):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("id", "item_id", "item__task_id"), ("record_id",))


@admin.register(StopRequest)
class StopRequestAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = (
        "task",
        "requested_at",
        "actor",
        "reason",
        "queued_cancelled",
        "dispatched",
        "duplicates",
        "fanout_done_at",
    )
    list_filter = (("requested_at", DateRangeFilter),)
    search_fields = ("task__title", "actor", "reason")
    list_select_related = ("task",)
    export_columns = columns(
        "id",
        "task_id",
        ("task_title", "task__title"),
        "requested_at",
        "actor",
        "reason",
        "queued_cancelled",
        "dispatched",
        "duplicates",
        "fanout_done_at",
    )


@admin.register(CancellationAttempt)
class CancellationAttemptAdmin(ExportMixin, ReadOnlyAdmin):
    list_display = ("id", "item", "mechanism", "action", "sent_at", "answered_at", "ok", "observed_status")
    list_filter = (
        recent_values("mechanism", "mechanism"),
        recent_values("action", "action"),
        "ok",
        ("sent_at", DateRangeFilter),
    )
    export_columns = columns(
        "id",
        "item_id",
        ("task_id", "item__task_id"),
        "mechanism",
        "action",
        "sent_at",
        "answered_at",
        "ok",
        "observed_status",
        "detail",
    )
    search_fields = ("=item__id",)
    search_help_text = "An item id."
    list_select_related = ("item",)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[CancellationAttempt], search_term: str):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("item_id",))


@admin.register(Event)
class EventAdmin(ExportMixin, ReadOnlyAdmin):
    """Append-only for everyone. has_*_permission answer False before the superuser shortcut
    is consulted, so a superuser cannot add, change or delete an event here either."""

    list_display = ("at", "task", "item_id", "kind", "actor", "from_state", "to_state", "message")
    # No date hierarchy and no filter over to_state: both read every row of the table (SELECT
    # DISTINCT). The date filter and the kind filter go through indexes on (at) and (kind, at).
    list_filter = (recent_values("kind", "kind"), ("at", date_range("time")))
    search_fields = ("=task__id",)
    search_help_text = "A task id or an item id."
    list_select_related = ("task",)
    actions = None
    ordering = ("-at", "-id")  # an auditor looks for what just happened first
    readonly_fields = ("data_json",)
    exclude = ("data",)
    export_columns = columns(
        "id", "at", "task_id", "item_id", "kind", "actor", "from_state", "to_state", "message", "data", "seq", "hash"
    )

    class Media:
        css = {"all": ["stopdesk/admin.css"]}

    @admin.display(description="Data")
    def data_json(self, event: Event) -> str:
        return format_html('<pre class="event-data">{}</pre>', pretty_json(event.data))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Event], search_term: str):  # type: ignore[no-untyped-def]
        return id_search(queryset, search_term, ("task_id", "item_id"))


@admin.register(ApiIdempotency)
class ApiIdempotencyAdmin(ReadOnlyAdmin):
    list_display = ("runtime", "endpoint", "key", "status", "created_at")
    list_filter = ("runtime", recent_values("status", "status"))
    search_fields = ("=key",)


@admin.register(GatewaySession)
class GatewaySessionAdmin(ReadOnlyAdmin):
    """Which task each MCP gateway session files its calls under (the key is a digest of the
    client's name and version, or its session id, and the upstream)."""

    list_display = ("task", "key", "created_at")
    search_fields = ("=key",)
    raw_id_fields = ("task",)


# The runtime API's admin (token issuance) lives with the API; register a plain view of runtimes
# only until that module exists.
if importlib.util.find_spec("stopdesk.admin_runtime") is not None:
    importlib.import_module("stopdesk.admin_runtime")
elif not admin.site.is_registered(Runtime):

    @admin.register(Runtime)
    class RuntimeAdmin(ReadOnlyAdmin):
        list_display = ("name", "token_prefix", "created_at", "revoked_at")
        search_fields = ("name", "token_prefix")
