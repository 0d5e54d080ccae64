"""What keeps the admin's lists fast at ten million rows: capped counts, filters whose choices
come from a bounded query, and searches that go through an index.

Django's defaults scan the whole table in three places: the paginator's COUNT(*), a list filter
over a plain column (SELECT DISTINCT), and a search over text columns (ILIKE '%term%').
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from stopdesk.paging import AdminPaginator

RECENT_WINDOW = 2_000


class ReadOnlyAdmin(admin.ModelAdmin):
    """Look, never write: the services are the only writers of the ledger."""

    # Counts stop at 10,000 ("10,000+"): a full COUNT(*) grows with history (stopdesk.paging).
    show_full_result_count = False
    paginator = AdminPaginator
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RecentValuesFilter(admin.SimpleListFilter):
    """Choices are the values seen among the newest rows (newest RECENT_WINDOW by id), not a
    DISTINCT over the whole table; filtering by any value still works through the URL."""

    field = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = model_admin.model._default_manager.order_by("-pk").values_list(self.field, flat=True)
        values = {value for value in recent[:RECENT_WINDOW] if value not in (None, "")}
        selected = self.value()
        if selected:
            values.add(selected)
        return [(str(value), str(value)) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


def recent_values(field: str, title: str) -> type[RecentValuesFilter]:
    name = f"{field.replace('__', '_')}_recent"
    return type(name, (RecentValuesFilter,), {"field": field, "title": title, "parameter_name": field})


def id_search(queryset: QuerySet[Any], term: str, id_fields: tuple[str, ...], exact_fields: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """A number matches the id fields; any term matches the exact text fields. Each one has an
    index, so the search never scans the table."""
    term = term.strip()
    if not term:
        return queryset, False
    match = Q(pk__in=[])
    if term.isdigit() and int(term) < 2**63:
        for field in id_fields:
            match |= Q(**{field: int(term)})
    for field in exact_fields:
        match |= Q(**{field: term})
    return queryset.filter(match), False
