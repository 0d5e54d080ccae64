"""Sending: a notification becomes one delivery per recipient and endpoint, each claimed with a
conditional UPDATE, sent outside any transaction, and its result recorded in a new one.

Exactly once per endpoint: a delivery is claimed for a lease before the call goes out. A sender
that dies mid-send leaves the claim to expire and the sweep sends again with the same
`webhook-id`, which the receiver deduplicates on. Email carries a stable Message-ID for the same
reason (mail has no acknowledgement to wait for).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from stopdesk.notify.models import Delivery, DeliveryAttempt, EmailPreference, Notification, WebhookEndpoint
from stopdesk.notify.topics import ADMIN_DEFAULTS, DIGESTED, ROLE_DEFAULTS, Topic
from stopdesk.states import DELIVERY_TRANSITIONS, DeliveryState

D = DeliveryState
log = logging.getLogger(__name__)
DUE = (D.PENDING, D.RETRYING)


def cfg() -> dict[str, Any]:
    return settings.STOPDESK_NOTIFY  # type: ignore[no-any-return]


def backoff(attempts: int) -> timedelta:
    """Exponential: base, 2x, 4x ... capped."""
    base, cap = float(cfg()["RETRY_BASE_SECONDS"]), float(cfg()["RETRY_MAX_SECONDS"])
    return timedelta(seconds=min(cap, base * 2 ** max(attempts - 1, 0)))


@contextlib.contextmanager
def _bookkeeping(*, outcome: bool = False) -> Iterator[None]:
    """A transaction for delivery bookkeeping (expansion, claims) that does not wait for its commit
    to reach disk. Safe because losing one in a crash only means expanding or sending again with
    the same webhook-id, which receivers deduplicate; the outbox row itself was committed durably
    with its event. It saves a disk flush per step, the largest cost of a delivery on a busy
    database. `outcome`: the transaction records what a send did (sent, failed, its attempt), so it
    waits for the flush unless the operator opted out (STOPDESK_DURABLE_RESULTS=0)."""
    with transaction.atomic():
        durable = outcome and settings.STOPDESK.get("DURABLE_RESULTS", True)
        if connection.vendor == "postgresql" and not durable:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        yield


# --- who gets it ------------------------------------------------------------------------------


def email_topics(user: Any, groups: set[str]) -> frozenset[str]:
    chosen = EmailPreference.objects.filter(user=user).values_list("topics", flat=True).first()
    if chosen is not None:
        return frozenset(chosen)
    topics: set[str] = set()
    for group in groups:
        topics |= ROLE_DEFAULTS.get(group, frozenset())
    if user.is_superuser:
        topics |= ADMIN_DEFAULTS
    return frozenset(topics)


def _recipients(topics: frozenset[str], *, per_item: bool) -> list[tuple[int, str]]:
    """(user id, address) of active people with an address who take any of these topics by email
    (and, with `per_item`, who asked for one email per item)."""
    users = get_user_model().objects.filter(is_active=True).exclude(email="").prefetch_related("groups")
    chosen = {
        user_id: (set(t), each)
        for user_id, t, each in EmailPreference.objects.values_list("user_id", "topics", "per_item")
    }
    found = []
    for user in users:
        if user.pk in chosen:
            taken, each_item = chosen[user.pk]
        else:
            taken = set().union(*(ROLE_DEFAULTS.get(g.name, frozenset()) for g in user.groups.all()))
            each_item = False
            if user.is_superuser:
                taken |= ADMIN_DEFAULTS
        if topics & taken and (each_item or not per_item):
            found.append((user.pk, user.email))
    return found


def audience(notification: Notification) -> tuple[frozenset[str], bool]:
    """The topics a subscriber must take to get this notification, and whether it is a per-item
    alert (sent only to subscribers who asked for those; the others get their task's digest)."""
    if notification.topic == Topic.TASK_DIGEST:
        return frozenset({Topic.TASK_DIGEST, *notification.data.get("topics", ())}), False
    return frozenset({notification.topic}), notification.topic in DIGESTED


def _expand(notification: Notification) -> None:
    """Create the deliveries of a locked notification, once (a repeated call adds none)."""
    if notification.expanded_at is not None:
        return
    topics, per_item = audience(notification)
    rows = [
        Delivery(notification=notification, channel="webhook", endpoint=e, target=f"endpoint:{e.pk}")
        for e in WebhookEndpoint.objects.filter(active=True)
        if e.wants(topics, per_item=per_item)
    ]
    if cfg()["EMAIL"]:
        rows += [
            Delivery(notification=notification, channel="email", recipient=address, target=f"user:{user_id}")
            for user_id, address in _recipients(topics, per_item=per_item)
        ]
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)
    Notification.objects.filter(pk=notification.pk).update(expanded_at=timezone.now())


def _due(now: datetime, *, force: bool = False) -> Q:
    """Due for an attempt: pending, or a retry whose time came, or a send whose sender's claim ran
    out (it died mid-send). `force` (a person re-sends) also takes delivered and failed ones."""
    if force:
        return Q(state__in=(D.DELIVERED, D.FAILED, *DUE)) | Q(state=D.SENDING, claimed_until__lt=now)
    due = Q(state__in=DUE) & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
    return due | Q(state=D.SENDING, claimed_until__lt=now)


def _take(where: Q, *, claimed_until: datetime) -> list[int]:
    """Inside the caller's transaction: mark the matching rows no other sender holds as sending,
    one more attempt each, and return their ids."""
    ids = list(Delivery.objects.filter(where).select_for_update(skip_locked=True).values_list("id", flat=True))
    if ids:
        delivery_move(
            Q(pk__in=ids),
            from_states=tuple(DELIVERY_TRANSITIONS),
            to_state=D.SENDING,
            claimed_until=claimed_until,
            attempts=F("attempts") + 1,
        )
    return ids


def delivery_move(where: Q, *, from_states: tuple[str, ...], to_state: str, **fields: Any) -> int:
    """Every move of a delivery's state: checked against `DELIVERY_TRANSITIONS`, a conditional
    UPDATE (the rows matching `where` that are still in one of `from_states`), in the caller's
    transaction. Returns how many rows moved. A delivery's record of each try is its
    `DeliveryAttempt` row (written by `delivery_record`), not an audit event: deliveries are
    bookkeeping of the outbox, whose notification was committed with its event."""
    for state in from_states:
        if to_state not in DELIVERY_TRANSITIONS[state]:
            raise ValueError(f"delivery {state} -> {to_state} is not an allowed move")
    return Delivery.objects.filter(where, state__in=from_states).update(state=to_state, **fields)


def deliveries_claim(where: Q, *, now: datetime | None = None, force: bool = False) -> list[Delivery]:
    """Take the due deliveries matching `where` for one attempt each (conditional UPDATE: rows
    another sender holds are skipped). Returns them with their notification and endpoint."""
    now = now or timezone.now()
    lease = timedelta(seconds=float(cfg()["CLAIM_SECONDS"]))
    with _bookkeeping():
        ids = _take(where & _due(now, force=force), claimed_until=now + lease)
    if not ids:
        return []
    return list(Delivery.objects.select_related("notification", "endpoint").filter(pk__in=ids).order_by("id"))


def notification_claim(notification_id: int) -> list[Delivery]:
    """Expand a notification (first time only) and claim its due deliveries, in one transaction."""
    now = timezone.now()
    lease = timedelta(seconds=float(cfg()["CLAIM_SECONDS"]))
    with _bookkeeping():
        notification = Notification.objects.select_for_update().filter(pk=notification_id).first()
        if notification is None:
            return []
        _expand(notification)
        ids = _take(_due(now) & Q(notification_id=notification_id), claimed_until=now + lease)
    if not ids:
        return []
    found = list(Delivery.objects.select_related("endpoint").filter(pk__in=ids).order_by("id"))
    for delivery in found:
        delivery.notification = notification
    return found


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    error: str
    ms: float


def payload(notification: Notification) -> dict[str, Any]:
    """Standard Webhooks' `type`/`timestamp`/`data`, plus `text`, which is all a Slack or Teams
    simple incoming webhook needs (they ignore the other fields)."""
    return {
        "type": f"stopdesk.{notification.topic}",
        "timestamp": notification.created_at.isoformat(),
        "text": notification.body or notification.title,
        "data": {"id": notification.message_id, "title": notification.title, **notification.data},
    }


_client: tuple[int, httpx.Client] | None = None


def _http() -> httpx.Client:
    """One client per process: building one loads the CA bundle (about 20 ms of CPU), and keeping
    it reuses connections to the same endpoint. Per process id, so a forked worker child builds
    its own rather than share the parent's sockets."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), httpx.Client(follow_redirects=False))
    return _client[1]


def _send_webhook(delivery: Delivery) -> Outcome:
    endpoint = delivery.endpoint
    assert endpoint is not None
    notification = delivery.notification
    body = json.dumps(payload(notification), separators=(",", ":"), sort_keys=True)
    sent_at = datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": notification.message_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": Webhook(endpoint.secret).sign(notification.message_id, sent_at, body),
        "user-agent": "stopdesk-webhooks",
    }
    started = time.monotonic()
    try:
        response = _http().post(endpoint.url, content=body.encode(), headers=headers, timeout=cfg()["TIMEOUT_SECONDS"])
    except httpx.HTTPError as exc:
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500], (time.monotonic() - started) * 1000)
    ms = (time.monotonic() - started) * 1000
    ok = 200 <= response.status_code < 300
    return Outcome(ok, response.status_code, "" if ok else response.text[:500], ms)


def _send_email(delivery: Delivery) -> Outcome:
    notification = delivery.notification
    started = time.monotonic()
    message = EmailMessage(
        subject=f"[stopdesk] {notification.title}"[:200],
        body=notification.body,
        to=[delivery.recipient],
        # Stable across retries, so a second copy after a crash threads as the same message.
        headers={"Message-ID": f"<{notification.message_id}.{delivery.target.replace(':', '-')}@stopdesk>"},
    )
    try:
        message.send()
    except Exception as exc:  # SMTP errors have no common base class
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500], (time.monotonic() - started) * 1000)
    return Outcome(True, None, "", (time.monotonic() - started) * 1000)


def delivery_attempt(delivery: Delivery, *, manual: bool = False) -> str:
    """Send one claimed delivery (no transaction open) and record the result."""
    outcome = _send_webhook(delivery) if delivery.channel == "webhook" else _send_email(delivery)
    return delivery_record(delivery, outcome, manual=manual)


def delivery_record(delivery: Delivery, outcome: Outcome, *, manual: bool = False) -> str:
    now = timezone.now()
    fields: dict[str, Any]
    if outcome.ok:
        to_state, fields = D.DELIVERED, {"delivered_at": now, "next_attempt_at": None}
    elif delivery.attempts >= int(cfg()["MAX_ATTEMPTS"]):
        to_state, fields = D.FAILED, {"next_attempt_at": None}
    else:
        to_state, fields = D.RETRYING, {"next_attempt_at": now + backoff(delivery.attempts)}
    with _bookkeeping(outcome=True):
        # Only the holder of the claim records; a sender whose claim ran out lost it to a re-send.
        delivery_move(
            Q(pk=delivery.pk),
            from_states=(D.SENDING,),
            to_state=to_state,
            claimed_until=None,
            last_status=outcome.status,
            last_error=outcome.error,
            **fields,
        )
        DeliveryAttempt.objects.create(
            delivery_id=delivery.pk, at=now, status=outcome.status, error=outcome.error, ms=outcome.ms, manual=manual
        )
    return str(to_state)


def notifications_deliver(notification_ids: list[int]) -> dict[str, int]:
    """Expand each notification and make one attempt at each of its due deliveries."""
    tally: dict[str, int] = {}
    for notification_id in notification_ids:
        for delivery in notification_claim(notification_id):
            state = delivery_attempt(delivery)
            tally[state] = tally.get(state, 0) + 1
    return tally


def delivery_resend(delivery_id: int) -> str | None:
    """A person's re-send from the admin: one more attempt whatever the state, same webhook-id."""
    claimed = deliveries_claim(Q(pk=delivery_id), force=True)
    return delivery_attempt(claimed[0], manual=True) if claimed else None


def deliveries_due(*, now: datetime | None = None, limit: int = 200) -> list[int]:
    """Ids of notifications with work: unexpanded ones (their job was lost), deliveries due for a
    retry, and sends whose sender died (claim expired). Bounded by `limit`."""
    now = now or timezone.now()
    grace = now - timedelta(seconds=float(cfg()["LOST_JOB_SECONDS"]))
    unexpanded = Notification.objects.filter(expanded_at__isnull=True, created_at__lt=grace).order_by("created_at")
    ids = list(unexpanded.values_list("id", flat=True)[:limit])
    due = Delivery.objects.filter(
        (Q(state=D.RETRYING, next_attempt_at__lte=now))
        | Q(state=D.SENDING, claimed_until__lt=now)
        | Q(state=D.PENDING, created_at__lt=grace)
    ).order_by("next_attempt_at")
    ids += list(due.values_list("notification_id", flat=True)[:limit])
    return list(dict.fromkeys(ids))
