"""Structured logs that carry the stopdesk task and item a line is about.

Every record gets `task_id` and `item_id` (empty when unknown), from, in order:
1. `log_context(task=..., item=...)`, which agent code and services can wrap work in;
2. the running Celery task's keyword arguments (`item_id`, `stopdesk_task_id`), so every line a
   LedgerTask logs says which item it was working on without passing ids around.

`JsonFormatter` writes one JSON object per line (production: log shippers parse it);
`KeyValueFormatter` writes `key=value` pairs a person can read in a terminal.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("stopdesk_log_context", default=None)


@contextmanager
def log_context(*, task: int | None = None, item: int | None = None) -> Iterator[None]:
    current = dict(_context.get() or {})
    if task is not None:
        current["task_id"] = task
    if item is not None:
        current["item_id"] = item
    token = _context.set(current)
    try:
        yield
    finally:
        _context.reset(token)


def _from_celery() -> dict[str, Any]:
    try:
        from celery import current_task
    except ImportError:  # pragma: no cover - celery is a dependency
        return {}
    task = current_task
    if not task or task.request is None or task.request.id is None:
        return {}
    kwargs = task.request.kwargs or {}
    found: dict[str, Any] = {"celery_id": task.request.id}
    if "item_id" in kwargs:
        found["item_id"] = kwargs["item_id"]
    if "stopdesk_task_id" in kwargs:
        found["task_id"] = kwargs["stopdesk_task_id"]
    return found


class ContextFilter(logging.Filter):
    """Adds task_id, item_id and celery_id to every record (empty strings when unknown)."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = {**_from_celery(), **(_context.get() or {})}
        for name in ("task_id", "item_id", "celery_id"):
            if not hasattr(record, name):
                setattr(record, name, found.get(name, ""))
        return True


_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value not in ("", None):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


_LINE_BREAKS = str.maketrans({"\n": "\\n", "\r": "\\r", "\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\x85"})


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ids = "".join(
            f" {name}={getattr(record, name)}" for name in ("task_id", "item_id") if getattr(record, name, "") != ""
        )
        # Messages carry runtime text (a task title, a handle): a line break in it must not start
        # what reads as another log line.
        message = record.getMessage().translate(_LINE_BREAKS)
        line = f"{self.formatTime(record)} {record.levelname} {record.name}{ids} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


events_log = logging.getLogger("stopdesk.events")


def log_event(sender: Any, instance: Any, created: bool, **_: Any) -> None:
    """Every audit event also goes to the log, with its task and item (post_save of Event)."""
    if created and events_log.isEnabledFor(logging.INFO):
        events_log.info(
            "%s %s%s%s",
            instance.kind,
            instance.actor,
            f" {instance.from_state or '-'}->{instance.to_state}" if instance.to_state else "",
            f": {instance.message}" if instance.message else "",
            extra={"task_id": instance.task_id or "", "item_id": instance.item_id or "", "event": instance.kind},
        )


def logging_config(*, production: bool, level: str) -> dict[str, Any]:
    """The LOGGING dict: one console handler, JSON in production, key=value otherwise."""
    formatter = "json" if production else "kv"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "stopdesk.logs.ContextFilter"}},
        "formatters": {
            "json": {"()": "stopdesk.logs.JsonFormatter"},
            "kv": {"()": "stopdesk.logs.KeyValueFormatter"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": formatter, "filters": ["context"]}},
        "root": {"handlers": ["console"], "level": level},
    }
