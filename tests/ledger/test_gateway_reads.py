"""The MCP gateway's reads of the ledger on either database (PostgreSQL in `make test`, SQLite,
the embedded default, in `make test-sqlite`): the retry gate's identical calls, and the item behind
a client's task id."""

from __future__ import annotations

from typing import Any

import pytest

from stopdesk.gateway.recorded_tasks import recorded_item
from stopdesk.gateway.retry_gate import earlier_blocking
from stopdesk.models import Task, WorkItem
from stopdesk.services.items import item_record_detail
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState, Kind
from tests.factories import make_item, make_task

S = ItemState


def gateway_call(task: Task, state: str, **facts: Any) -> WorkItem:
    item = make_item(task, state=state, kind=Kind.REMOTE_TOOL, mechanism="mcp", noun="tools: send")
    gateway = {"upstream": "tools", "tool": "send", "arguments_sha256": "h1", **facts}
    item_record_detail(item_id=item.pk, detail={"gateway": gateway}, actor="gateway:mcp")
    return item


def blocking(task: Task, tool: str = "send", arguments_sha256: str = "h1") -> int | None:
    found = earlier_blocking(task_id=task.pk, upstream="tools", tool=tool, arguments_sha256=arguments_sha256)
    return found.pk if found is not None else None


@pytest.mark.django_db
def test_the_retry_gate_finds_the_identical_call_whose_outcome_is_unknown():
    task = make_task()
    gateway_call(task, S.COMPLETED)  # answered, never in doubt: repeating it is a new intent
    unknown = gateway_call(task, S.UNCERTAIN)
    gateway_call(task, S.UNCERTAIN, arguments_sha256="h2")
    assert blocking(task) == unknown.pk
    assert blocking(task, tool="other") is None
    assert blocking(make_task()) is None  # another session's calls are not this one's


@pytest.mark.django_db
def test_the_retry_gate_refuses_after_a_call_found_to_have_taken_effect_and_passes_after_one_that_did_not():
    task = make_task()
    took_effect = gateway_call(task, S.UNCERTAIN)
    item_transition(item_id=took_effect.pk, to_state=S.COMPLETED, actor="reviewer")
    assert blocking(task) == took_effect.pk
    other = make_task()
    did_not = gateway_call(other, S.UNCERTAIN)
    item_transition(item_id=did_not.pk, to_state=S.FAILED, actor="reviewer")
    assert blocking(other) is None


@pytest.mark.django_db
def test_the_item_behind_a_clients_task_id_is_found_by_that_id_and_upstream():
    item = gateway_call(make_task(), S.RUNNING, client_task_id="gw-task-1")
    assert recorded_item("tools", "gw-task-1") == item
    assert recorded_item("tools", "gw-task-2") is None
    assert recorded_item("elsewhere", "gw-task-1") is None
