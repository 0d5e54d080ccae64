"""Small template helpers for the pages."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
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
