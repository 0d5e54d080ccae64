"""A date range filter for the admin's lists: "yesterday" and "last month" are one click, any range
is two dates typed into the filter itself, never a hand-written URL.

The range travels as `<field>__gte` (from, included) and `<field>__lt` (until, not included), the
parameters Django's own date filter uses, so its links keep working; the form's "to" day is
included (`<field>__lte` with a date means up to the end of that day). A bare date is midnight
in the current time zone.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime


def moment(text: str) -> tuple[dt.datetime, bool]:
    """An aware datetime for `text` and whether `text` was a bare date."""
    text = text.strip()
    try:
        # A date first: parse_datetime would read "2026-12-01" as that day's midnight too.
        day = parse_date(text)
        when = None if day else parse_datetime(text)
    except ValueError:
        when = day = None
    if when is None and day is None:
        raise IncorrectLookupParameters(f"{text!r} is not a date (YYYY-MM-DD) or a date and time.")
    if day is not None:
        return timezone.make_aware(dt.datetime.combine(day, dt.time.min)), True
    assert when is not None
    return (when if timezone.is_aware(when) else timezone.make_aware(when)), False


class DateRangeFilter(admin.DateFieldListFilter):
    template = "admin/stopdesk/date_range_filter.html"
    range_title = ""

    def __init__(self, field, request, params, model, model_admin, field_path):  # type: ignore[no-untyped-def]
        self.lookup_kwarg_through = f"{field_path}__lte"
        super().__init__(field, request, params, model, model_admin, field_path)
        self.title = self.range_title or self.title
        today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
        tomorrow = today + dt.timedelta(days=1)
        month = today.replace(day=1)
        last_month = (month - dt.timedelta(days=1)).replace(day=1)
        next_month = (month + dt.timedelta(days=32)).replace(day=1)
        since, until = self.lookup_kwarg_since, self.lookup_kwarg_until
        ranges = (
            ("Today", today, tomorrow),
            ("Yesterday", today - dt.timedelta(days=1), today),
            ("Past 7 days", today - dt.timedelta(days=7), tomorrow),
            ("This month", month, next_month),
            ("Last month", last_month, month),
            ("This year", today.replace(month=1, day=1), today.replace(year=today.year + 1, month=1, day=1)),
        )
        nulls = tuple(link for link in self.links if self.field_generic + "isnull" in link[1])
        links: list[Any] = [("Any date", {}), *((title, {since: a, until: b}) for title, a, b in ranges), *nulls]
        self.links = tuple(links)

    def expected_parameters(self) -> list[str | None]:
        return [*super().expected_parameters(), self.lookup_kwarg_through]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        conditions: dict[str, Any] = {}
        for key, values in self.used_parameters.items():
            value = values[-1] if isinstance(values, list) else values
            if value in ("", None):
                continue  # a date the range form left empty
            if key not in (self.lookup_kwarg_since, self.lookup_kwarg_until, self.lookup_kwarg_through):
                conditions[key] = value in (True, "True", "true", "1")  # isnull
                continue
            when, bare_date = moment(str(value))
            if key == self.lookup_kwarg_through and bare_date:
                conditions[self.lookup_kwarg_until] = when + dt.timedelta(days=1)
            else:
                conditions[key] = when
        return queryset.filter(**conditions)

    def choices(self, changelist):  # type: ignore[no-untyped-def]
        # The range form sends the list's other filters along, as hidden fields.
        self.kept = [
            (key, value)
            for key, values in changelist.filter_params.items()
            if not key.startswith(self.field_generic)
            for value in values
        ]
        yield from super().choices(changelist)

    def form_values(self) -> dict[str, str]:
        """What the range form shows: the chosen from and to days, when the range is whole days."""
        shown = {}
        since = self.date_params.get(self.lookup_kwarg_since)
        if since:
            shown["from"] = _day(since)
        through = self.date_params.get(self.lookup_kwarg_through)
        until = self.date_params.get(self.lookup_kwarg_until)
        if through:
            shown["to"] = _day(through)
        elif until:
            shown["to"] = _day(until, before=True)
        return shown


def date_range(title: str) -> type[DateRangeFilter]:
    """A DateRangeFilter headed "By <title>" (a field named `at` would read "By at")."""
    return type(f"{title.replace(' ', '_')}_range", (DateRangeFilter,), {"range_title": title})


def _day(text: str, before: bool = False) -> str:
    try:
        when, _ = moment(text)
    except IncorrectLookupParameters:
        return ""
    when = timezone.localtime(when)
    if before:
        when -= dt.timedelta(microseconds=1)
    return when.date().isoformat()
