"""Provider webhooks as a wake-up, never as the truth.

OpenAI sends `response.completed / cancelled / failed / incomplete` to a registered URL (at least
once, in no particular order, retried with backoff until it gets a 2xx). A delivery only says
"look at response X now": it is kept by its `webhook-id` (so a redelivery, also after a restart,
wakes nothing twice) and the items whose handle is that response are read back at once through
the same path as every other read-back (an attempt row, the adapter's `inspect`, the engine). The
event's type is kept on the delivery's row and never reaches the record: the read-back decides.

- A read-back that finds the work final is applied like any other: it settles an item in flight
  or an uncertain one, confirms a `cancelled` or turns it into a late result.
- One that finds it still running (or cannot reach the provider) changes nothing but its attempt
  row: the item keeps the schedule it had, so a stray or early delivery never starts a deadline
  on work nobody asked to stop, and never delays a cancel that is due. Polling stays the fallback.
- A stopped item whose cancel is still to be sent is left to the canceller, whose read-back
  follows the cancel: a wake-up never holds an item from it.
- A delivery for a response no item has recorded yet (the webhook overtook the create's answer)
  is kept; recording the handle asks for the read-back then (`webhook_wake_recorded`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import ItemRef
from reconcile.models import ProviderWebhook
from reconcile.services.lease import lease_seconds
from reconcile.services.reconcile import Result, attempt_apply, attempt_close, choose_action, observe
from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.states import RECONCILABLE, ItemState

log = logging.getLogger(__name__)
S = ItemState

ACTOR = "system:webhook"
# What a read-back can still move: work in flight or uncertain, and a `cancelled` (a read-back
# that finds it completed is a late result). Completed and failed items are left alone, as by
# the sweep, and so is a `cancelled` whose late result is already recorded: it waits for a person,
# and every further delivery (the flip's own `response.cancelled`, say) would only report it again.
WAKEABLE = RECONCILABLE | {S.CANCELLED}


def _wakeable_items() -> QuerySet[WorkItem]:
    return WorkItem.objects.filter(state__in=WAKEABLE).exclude(state=S.CANCELLED, evidence__has_key="late_result")


@dataclass(frozen=True)
class Delivery:
    provider: str  # also the mechanism whose items it names ("openai")
    webhook_id: str
    event_type: str
    handle: str


def webhook_receive(*, delivery: Delivery) -> list[int] | None:
    """Keep `delivery` and return the items to read back now; None when it was received before
    (a redelivery: nothing to do). The caller queues the read-backs after commit."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = ProviderWebhook.objects.create(
                    provider=delivery.provider,
                    webhook_id=delivery.webhook_id,
                    event_type=delivery.event_type,
                    handle=delivery.handle,
                )
        except IntegrityError:
            return None  # the unique (provider, webhook_id): received before, or at this moment
        ids = _wakeable(delivery.provider, delivery.handle, skip=_RECORDED_AS.get(delivery.event_type))
        if ids:
            ProviderWebhook.objects.filter(pk=row.pk).update(woke=len(ids))
    return ids


def webhook_forget(*, provider: str, webhook_id: str) -> None:
    """Drop a kept delivery whose read-back could not be queued (the broker is down), so that
    the provider's redelivery is taken rather than answered as a duplicate."""
    ProviderWebhook.objects.filter(provider=provider, webhook_id=webhook_id).delete()


def webhook_wake_recorded(*, mechanism: str, handle: str) -> list[int]:
    """The items to read back because a delivery for `handle` arrived before any item had it as
    its handle (called once the handle is recorded). Empty when none came, or when one already
    woke an item."""
    if not handle:
        return []
    came = ProviderWebhook.objects.filter(provider=mechanism, handle=handle)
    woke = list(came.values_list("woke", flat=True))  # one probe on the create's path; usually none
    if not woke or any(woke):
        return []
    ids = _wakeable(mechanism, handle)
    if ids:
        came.update(woke=len(ids))
    return ids


# A `response.cancelled` for an item already recorded cancelled asks for nothing a read-back could
# add: the record already says it, and a later flip sends `response.completed`, which is read back.
# The event only ever saves a read; it never settles anything.
_RECORDED_AS = {"response.cancelled": S.CANCELLED}


def _wakeable(mechanism: str, handle: str, skip: str | None = None) -> list[int]:
    items = _wakeable_items().filter(mechanism=mechanism, handle=handle).exclude(handle="")
    if skip is not None:
        items = items.exclude(state=skip)
    return sorted(items.values_list("pk", flat=True))


def item_wake(*, item_id: int, actor: str = ACTOR, now: datetime | None = None) -> Result:
    """Read `item_id` back now because its provider said it changed. Taken whatever its next check
    (a wake-up is not a scheduled check); the read-back is applied only if it found the work
    final, otherwise the schedule it had is put back."""
    now = now or timezone.now()
    with transaction.atomic():
        item = _wakeable_items().select_for_update().filter(pk=item_id).first()
        if item is None:
            return Result(item_id, "skipped", "", "")
        mechanism = registry.get(item.mechanism)
        if choose_action(item, mechanism) == "cancel":
            # Stop's cancel is still to be sent (or sent again): the canceller reads back right
            # after it, and a hold here would make the canceller's claim skip the item.
            return Result(item_id, "skipped", "", item.state)
        previous = item.next_check_at
        # Held past the read-back's timeout, so a sweep does not read it back at the same time.
        hold = now + timedelta(seconds=max(lease_seconds(), 2 * mechanism.settings.call_timeout_s))
        WorkItem.objects.filter(pk=item_id).update(next_check_at=hold)
        attempt = CancellationAttempt.objects.create(item=item, mechanism=mechanism.name, action="inspect", sent_at=now)
    observation = observe(mechanism, ItemRef.of(item), "inspect")
    if observation.final:
        return attempt_apply(item, mechanism, attempt, observation, action="inspect", actor=actor, now=now)
    attempt_close(attempt.pk, observation)
    # Only if the hold is still ours: a sweep or a canceller that took the item since has its own plan.
    WorkItem.objects.filter(pk=item_id, next_check_at=hold).update(next_check_at=previous)
    return Result(item_id, "inspect", str(observation.seen), item.state)
