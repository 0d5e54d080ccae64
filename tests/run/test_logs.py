"""Log lines carry the task and the item they are about."""

from __future__ import annotations

import json
import logging

import pytest

from stopdesk.logs import ContextFilter, JsonFormatter, KeyValueFormatter, log_context
from stopdesk.services.items import item_register, task_create


def record(message: str = "hello") -> logging.LogRecord:
    rec = logging.LogRecord("stopdesk.test", logging.INFO, __file__, 1, message, None, None)
    ContextFilter().filter(rec)
    return rec


def test_a_line_inside_log_context_carries_task_and_item_as_json() -> None:
    with log_context(task=7, item=42):
        line = json.loads(JsonFormatter().format(record()))
    assert line["task_id"] == 7 and line["item_id"] == 42
    assert line["message"] == "hello" and line["level"] == "INFO" and line["logger"] == "stopdesk.test"


def test_a_line_outside_any_context_has_no_ids() -> None:
    line = json.loads(JsonFormatter().format(record()))
    assert "task_id" not in line and "item_id" not in line
    assert " task_id=" not in KeyValueFormatter().format(record())


def test_key_value_lines_name_the_ids_for_people() -> None:
    with log_context(task=3), log_context(item=9):
        assert "task_id=3 item_id=9 hello" in KeyValueFormatter().format(record())


@pytest.mark.django_db
def test_every_audit_event_is_also_a_log_line_with_its_task_and_item(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stopdesk.events")
    task = task_create(title="t", actor="test")
    item = item_register(task=task, kind="local_worker", noun="step", actor="test")
    registered = [r for r in caplog.records if getattr(r, "event", "") == "item_registered"]
    assert len(registered) == 1
    assert registered[0].task_id == task.pk and registered[0].item_id == item.pk


def test_a_runtime_line_break_cannot_forge_a_second_key_value_line() -> None:
    forged = "Analyse\n2026-12-01 10:00:00,000 INFO stopdesk.events task_id=1 stop_requested user:admin"
    line = KeyValueFormatter().format(record(forged))
    assert "\n" not in line and "\r" not in line
    assert line.endswith("Analyse\\n2026-12-01 10:00:00,000 INFO stopdesk.events task_id=1 stop_requested user:admin")
