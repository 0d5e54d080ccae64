"""Small template helpers for the pages."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

register = template.Library()


@register.filter
def web_url(value: str) -> str:
    """Only http(s) links from other systems become hrefs; anything else (javascript:, data:) is dropped."""
    text = str(value or "")
    return text if text.startswith(("https://", "http://")) else ""


@register.filter
def time_left(deadline: datetime | None) -> str:
    """ "3 hours left" or "overdue by 2 hours"."""
    if deadline is None:
        return "no deadline"
    now = timezone.now()
    if deadline < now:
        return f"overdue by {timesince(deadline, now, depth=1)}"
    return f"{timeuntil(deadline, now, depth=1)} left"


@register.filter
def overdue(deadline: datetime | None) -> bool:
    return deadline is not None and deadline < timezone.now()


NO_VERSION = "no version (a reversal could not check it for later changes)"


@register.filter
def version_text(version: str | None) -> str:
    """ "version 3", or what the absence of a version means (an email has none)."""
    if version:
        return format_html("version <code>{}</code>", version)
    return NO_VERSION


@register.filter
def pretty_json(value: object) -> str:
    """Event data as a person reads JSON: indented, keys in order, not Python's dict text."""
    import json

    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def action_words(action: str) -> str:
    """ "report_only" as a person writes it: "report only"."""
    return str(action or "").replace("_", " ")
