"""Template helpers for work items that need the mechanisms' view of them."""

from __future__ import annotations

from datetime import datetime

from django import template

from reconcile.services.report import report_deadline as _report_deadline
from stopdesk.models import WorkItem

register = template.Library()


@register.filter
def report_deadline(item: WorkItem) -> datetime | None:
    """When work that waits for its result to be reported turns uncertain; None for other items."""
    return _report_deadline(item)
