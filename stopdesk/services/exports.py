"""An export out of the admin is itself audited: who took which rows, filtered how."""

from __future__ import annotations

from django.db import transaction

from stopdesk.models import Event
from stopdesk.services.events import event_record


def export_began(*, actor: str, what: str, fmt: str, filters: dict[str, str]) -> Event:
    """Written before the first row is sent: it says an export began, not how far it got (a
    download can be cut off by the person or the network)."""
    described = ", ".join(f"{key}={value}" for key, value in sorted(filters.items())) or "no filter"
    with transaction.atomic():
        return event_record(
            kind="export_began",
            actor=actor,
            message=f"Export of {what} as {fmt} began ({described}).",
            data={"what": what, "format": fmt, "filters": dict(sorted(filters.items()))},
        )
