"""Which task a gateway session's calls are filed under, the same in every gateway process."""

from __future__ import annotations

import hashlib

from django.db import connection, transaction

from stopdesk.models import GatewaySession
from stopdesk.services.items import task_create


def gateway_session_task(*, key: str, title: str, actor: str) -> int:
    """The newest open task of the session `key`, or a new one named `title`. A closed task is
    never reused: the session's next call opens a new task (a stopped task stays the session's
    until it closes, so Stop keeps refusing its calls)."""
    found = _open_task(key)
    if found is not None:
        return found
    with transaction.atomic():
        _lock_session_key(key)  # two processes seeing the session's first calls at once open one task
        found = _open_task(key)
        if found is None:
            found = task_create(title=title, actor=actor).pk
            GatewaySession.objects.create(key=key, task_id=found)
        return found


def _open_task(key: str) -> int | None:
    return (
        GatewaySession.objects.filter(key=key, task__closed_at__isnull=True)
        .order_by("-pk")
        .values_list("task_id", flat=True)
        .first()
    )


def _lock_session_key(key: str) -> None:
    """A transaction-level advisory lock on the key (PostgreSQL; SQLite serialises writers anyway)."""
    if connection.vendor != "postgresql":
        return
    digest = hashlib.sha256(f"gateway-session\0{key}".encode()).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)])
