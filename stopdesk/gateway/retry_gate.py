"""The retry gate: a call identical to one whose outcome is still unknown is not forwarded.

MCP has no request idempotency, and on 2026-07-28 HTTP a dropped stream is the same as a
cancel: the client re-issues the call as a new request. When the earlier call may have taken
effect (it is uncertain, or the reconciler is still looking), sending it again could do the work
twice (a second email, a second issue). Identical means the same task (the session), upstream,
tool and arguments hash. Once the earlier call is settled (by its status check or a reviewer),
the gate lets the next identical call through."""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

from stopdesk.models import WorkItem
from stopdesk.states import ItemState

UNSETTLED = (ItemState.UNCERTAIN, ItemState.AWAITING_RECONCILIATION)


def earlier_unsettled(*, task_id: int, upstream: str, tool: str, arguments_sha256: str) -> WorkItem | None:
    """The first identical call of the task whose outcome is not known yet, if any."""
    return (
        WorkItem.objects.filter(
            task_id=task_id,
            state__in=UNSETTLED,
            detail__gateway__upstream=upstream,
            detail__gateway__tool=tool,
            detail__gateway__arguments_sha256=arguments_sha256,
        )
        .order_by("pk")
        .first()
    )


def held_words(earlier: WorkItem) -> str:
    """What the client is told: which call it repeats, and where a person settles it."""
    return (
        f"not forwarded: an identical call (item {earlier.pk}, {earlier.state}) may already have taken "
        f"effect; review it at {review_link(earlier.pk)} and call again once it is settled"
    )


def review_link(item_id: int) -> str:
    base = str(settings.STOPDESK_NOTIFY["BASE_URL"]).rstrip("/")
    return base + reverse("item-detail", args=[item_id])
