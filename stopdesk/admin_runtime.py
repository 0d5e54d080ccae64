"""Runtimes in the Django admin. Creating a runtime, or rotating its token, shows the token once in a
message; only its hash is stored. Imported by stopdesk/admin.py."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from stopdesk.models import Runtime
from stopdesk.services.events import actor_for
from stopdesk.services.runtimes import runtime_revoke, runtime_rotate


class RuntimeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "token_prefix", "created_at", "revoked_at", "is_active")
    search_fields = ("name", "token_prefix")
    fields = ("name", "token_prefix", "created_at", "revoked_at")
    readonly_fields = ("token_prefix", "created_at", "revoked_at")
    actions = ("revoke_tokens", "rotate_tokens")

    @admin.display(boolean=True)
    def is_active(self, obj: Runtime) -> bool:
        return obj.is_active

    def save_model(self, request: HttpRequest, obj: Runtime, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token = runtime_rotate(runtime=obj, actor=actor_for(request.user))
        _show_once(request, obj, token)

    @admin.action(description="Revoke the selected runtimes' tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Runtime]) -> None:
        revoked = sum(runtime_revoke(runtime=r, actor=actor_for(request.user)) for r in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)

    @admin.action(description="Rotate the selected runtimes' tokens (shows each new token once)")
    def rotate_tokens(self, request: HttpRequest, queryset: QuerySet[Runtime]) -> None:
        for runtime in queryset:
            _show_once(request, runtime, runtime_rotate(runtime=runtime, actor=actor_for(request.user)))


def _show_once(request: HttpRequest, runtime: Runtime, token: str) -> None:
    messages.warning(
        request,
        f"Token for runtime {runtime.name!r}, shown once (only its hash is stored): {token}",
    )


if not admin.site.is_registered(Runtime):
    admin.site.register(Runtime, RuntimeAdmin)
