"""Heartbeat rows: beat writes one as it sends a job, a worker one when it runs the heartbeat job.
Readiness and /metrics read their ages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from stopdesk.notify.models import Heartbeat

_inherited: list[object] = []
BEAT = "beat"
WORKER = "worker"


def heartbeat_record(name: str, *, detail: dict[str, Any] | None = None, now: datetime | None = None) -> None:
    defaults: dict[str, Any] = {"at": now or timezone.now()}
    if detail is not None:
        defaults["detail"] = detail
    Heartbeat.objects.update_or_create(name=name, defaults=defaults)


def heartbeat_ages(names: tuple[str, ...] = (BEAT, WORKER), *, now: datetime | None = None) -> dict[str, float | None]:
    """Seconds since each heartbeat, None when there never was one. One query."""
    now = now or timezone.now()
    found = dict(Heartbeat.objects.filter(name__in=names).values_list("name", "at"))
    return {name: (now - found[name]).total_seconds() if name in found else None for name in names}


def _beat_published(sender: object = None, **_: object) -> None:
    close_old_connections()
    try:
        heartbeat_record(BEAT, detail={"last_job": str(sender)})
    except Exception:  # a database hiccup must not stop beat from sending jobs
        import logging

        logging.getLogger(__name__).exception("writing the beat heartbeat failed")


def connect_beat_signal() -> None:
    """Only the beat process records publishes as its heartbeat (web and workers publish too)."""
    from celery.signals import beat_init, before_task_publish

    def on_beat_init(**_: object) -> None:
        # Beat embedded in a worker runs in a forked process: the parent's database connection
        # must not be used (or closed) here. Keep it referenced so it is never finalised.
        from django.db import connections

        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                _inherited.append(conn.connection)
                conn.connection = None
        before_task_publish.connect(_beat_published, weak=False, dispatch_uid="stopdesk.notify.beat_heartbeat")

    beat_init.connect(on_beat_init, weak=False, dispatch_uid="stopdesk.notify.beat_init")
