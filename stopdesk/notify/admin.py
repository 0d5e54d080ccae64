"""The delivery log (attempts, status codes, next retry) with a manual re-send, the webhook
endpoints, and people's email choices."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from stopdesk.notify.delivery import delivery_resend
from stopdesk.notify.models import Delivery, DeliveryAttempt, Digest, EmailPreference, Notification, WebhookEndpoint


class AttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("at", "status", "error", "ms", "manual")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "notification", "channel", "target", "state", "attempts", "last_status", "next_attempt_at")
    list_filter = ("state", "channel")
    search_fields = ("target", "recipient", "notification__title")
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [AttemptInline]
    actions = ["resend"]
    list_select_related = ("notification",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Re-send now (same webhook-id)")
    def resend(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        results = [delivery_resend(d.pk) for d in queryset[:50]]
        sent = sum(1 for r in results if r == "delivered")
        self.message_user(
            request,
            f"{sent} of {len(results)} delivered; see each delivery's attempts.",
            messages.SUCCESS if sent == len(results) else messages.WARNING,
        )


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("id", "topic", "title", "created_at", "expanded_at")
    list_filter = ("topic",)
    readonly_fields = [f.name for f in Notification._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("name", "url", "active", "topics", "per_item")


@admin.register(EmailPreference)
class EmailPreferenceAdmin(admin.ModelAdmin):
    list_display = ("user", "topics", "per_item")


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ("id", "task_id", "opened_at", "messages", "last_message_at", "closed_at")
    readonly_fields = [f.name for f in Digest._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
