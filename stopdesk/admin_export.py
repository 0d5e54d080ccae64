"""Export links on the admin's lists: the rows the list shows, with its filters and search, as CSV
or JSON Lines, every row and not only the page, streamed (stopdesk.exports).

Only staff who may view the list may export it, and each export is an audit event saying who
took what with which filters.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, PAGE_VAR
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone

from stopdesk.exports import FORMATS, Column, export_chunks
from stopdesk.services.events import actor_for
from stopdesk.services.exports import export_began


class ExportMixin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Set `export_columns` (stopdesk.exports.columns) on a ModelAdmin to give its list export links."""

    export_columns: tuple[Column, ...] = ()
    change_list_template = "admin/stopdesk/export_change_list.html"

    class Media:
        css = {"all": ["stopdesk/admin.css"]}

    def get_urls(self) -> list[Any]:
        opts = self.model._meta
        view = self.admin_site.admin_view(self.export_view)
        name = f"{opts.app_label}_{opts.model_name}_export"
        return [path("export/<str:fmt>/", view, name=name), *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        opts = self.model._meta
        query = request.GET.copy()
        for name in (PAGE_VAR, ERROR_FLAG):
            query.pop(name, None)
        suffix = f"?{query.urlencode()}" if query else ""
        links = [
            (fmt.label, reverse(f"admin:{opts.app_label}_{opts.model_name}_export", args=[fmt.name]) + suffix)
            for fmt in FORMATS.values()
        ]
        return super().changelist_view(request, {**(extra_context or {}), "export_links": links})

    def export_view(self, request: HttpRequest, fmt: str) -> HttpResponseBase:
        if fmt not in FORMATS:
            raise Http404(f"No export format {fmt!r}; there are {', '.join(FORMATS)}.")
        if not self.has_view_permission(request):
            raise PermissionDenied
        format_ = FORMATS[fmt]
        filters = {key: str(value) for key, value in request.GET.items() if key not in (PAGE_VAR, ERROR_FLAG)}
        try:
            queryset = self._filtered(request)
        except (IncorrectLookupParameters, FieldDoesNotExist, SuspiciousOperation) as exc:
            return HttpResponse(
                f"This list cannot be exported with these filters: {exc}",
                status=400,
                content_type="text/plain; charset=utf-8",
            )
        what = str(self.model._meta.verbose_name_plural)
        export_began(actor=actor_for(request.user), what=what, fmt=format_.label, filters=filters)
        response = StreamingHttpResponse(export_chunks(queryset, self.export_columns, format_))
        response["Content-Type"] = format_.content_type
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        filename = f"{self.model._meta.model_name}-{stamp}.{format_.extension}"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def _filtered(self, request: HttpRequest) -> Any:
        """The list's own queryset: its filters, search and order, without its page."""
        query = request.GET.copy()
        for name in (PAGE_VAR, ERROR_FLAG):
            query.pop(name, None)
        request.GET = query  # type: ignore[assignment]
        changelist = self.get_changelist_instance(request)
        return changelist.get_queryset(request)
