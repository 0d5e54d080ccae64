"""The audit chain's signed heads as a notification (`audit_anchor`), for a receiver that keeps
them where the database's owner cannot reach. Written in the seal's transaction, and only when an
active endpoint names the topic (it is sent to no one by default: a seal runs every few seconds)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.utils import timezone

from stopdesk.notify.models import Notification, WebhookEndpoint
from stopdesk.notify.outbox import notification_body, notifications_write
from stopdesk.notify.topics import Topic


def audit_anchor_wanted() -> bool:
    topic = Topic.AUDIT_ANCHOR.value
    return any(topic in (t or ()) for t in WebhookEndpoint.objects.filter(active=True).values_list("topics", flat=True))


def audit_anchor_notify(statement: dict[str, Any]) -> list[int]:
    if not audit_anchor_wanted():
        return []
    line = json.dumps(statement, sort_keys=True, separators=(",", ":"))
    title = f"Audit chain heads signed by {statement['key_id']}: {len(statement['heads'])} chains"
    return notifications_write(
        [
            Notification(
                topic=Topic.AUDIT_ANCHOR,
                dedupe_key=f"audit_anchor:{hashlib.sha256(line.encode()).hexdigest()}",
                title=title[:300],
                body=notification_body(title, None),
                data={"anchor": statement},
                created_at=timezone.now(),
            )
        ]
    )
