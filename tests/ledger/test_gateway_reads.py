"""The MCP gateway's reads of the ledger on either database (PostgreSQL in `make test`, SQLite,
the embedded default, in `make test-sqlite`): the retry gate's identical calls, and the item behind
a client's task id."""

from __future__ import annotations

from collections.abc import Callable
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
    return earlier_blocking(task_id=task.pk, upstream="tools", tool=tool, arguments_sha256=arguments_sha256)


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


def _workitem_rows_read(cursor: Any) -> int:
    """Rows of stopdesk_workitem this transaction has read so far, as PostgreSQL counts them: by
    sequential scans and fetched through an index, inside functions too."""
    cursor.execute(
        "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
        " WHERE relname = 'stopdesk_workitem'"
    )
    return int(cursor.fetchone()[0])


@pytest.mark.django_db
@pytest.mark.postgres
def test_the_retry_gate_reads_the_calls_that_may_hold_a_retry_not_every_identical_call_of_the_session():
    # An agent that reads the same thing many times: a read of all its identical calls made each
    # call slower than the one before (1,255 rows read at the 1,256th call).
    from django.db import connection

    task = make_task()
    for _ in range(120):
        gateway_call(task, S.COMPLETED)
    took_effect = gateway_call(task, S.UNCERTAIN)
    item_transition(item_id=took_effect.pk, to_state=S.COMPLETED, actor="reviewer")
    running = gateway_call(task, S.RUNNING)
    gate = "SELECT stopdesk_retry_gate_earlier(%s, 'tools', 'send', 'h1')"
    for statistics in ("as a fresh table's", "analysed"):  # a new session's, and once autovacuum ran
        with connection.cursor() as cursor:
            if statistics == "analysed":
                cursor.execute("ANALYZE stopdesk_workitem")
            before = _workitem_rows_read(cursor)
            cursor.execute(gate, [task.pk])
            assert cursor.fetchone()[0] == took_effect.pk
            read = _workitem_rows_read(cursor) - before
        # The running call and the one found to have taken effect; none of the 120 others.
        assert (statistics, read) == (statistics, 2)
    assert blocking(task) == took_effect.pk
    assert running.pk > took_effect.pk


IDENTICAL = {"upstream": "tools", "tool": "send", "arguments_sha256": "h1"}


def _second_copy_behind_the_gate(task: Task, second: Callable[[], int | str | None]) -> tuple[int, int | str | None]:
    """A first copy holds the gate's lock with its registration not yet committed; `second` runs
    in another thread, is seen waiting on that lock, and ends once the first commits. Returns the
    first copy's item and what `second` returned."""
    import threading

    from django.db import connection, transaction

    from stopdesk.gateway.retry_gate import gate_passed

    registered, commit, found = threading.Event(), threading.Event(), {}

    def first() -> None:
        try:
            with transaction.atomic():
                assert gate_passed(task_id=task.pk, **IDENTICAL) is None
                found["first"] = gateway_call(task, S.RUNNING).pk
                registered.set()
                assert commit.wait(30)
        finally:
            connection.close()

    def then_second() -> None:
        try:
            found["second"] = second()
        finally:
            connection.close()

    one = threading.Thread(target=first)
    one.start()
    assert registered.wait(30)
    two = threading.Thread(target=then_second)
    two.start()
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
    with connection.cursor() as cursor:
        for _ in range(600):  # the second copy waits on the gate's lock
            cursor.execute(waiting)
            if cursor.fetchone()[0] == 1:
                break
            two.join(0.05)
        else:
            raise AssertionError("the second copy did not wait for the gate's lock")
    assert two.is_alive()
    commit.set()
    one.join(30)
    two.join(30)
    return found["first"], found["second"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_retry_sent_while_the_first_copy_registers_waits_for_it_and_then_sees_it():
    # The gate's read runs after its lock is held, so the second copy sees the first once it committed.
    from django.db import transaction

    from stopdesk.gateway.retry_gate import gate_passed

    task = make_task()

    def second() -> int | None:
        with transaction.atomic():
            return gate_passed(task_id=task.pk, **IDENTICAL)

    first_item, seen_by_second = _second_copy_behind_the_gate(task, second)
    assert seen_by_second == first_item


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_a_call_registered_in_one_statement_waits_for_an_identical_call_registering_and_is_held_by_it():
    # The gateway's registration takes the gate in its own statement (`retry_hold`): it waits for
    # a copy holding the gate, then reads with a snapshot taken after the wait, sees the copy and
    # writes nothing.
    from stopdesk.gateway.retry_gate import retry_hold
    from stopdesk.services.errors import Held
    from stopdesk.services.items import item_register_started

    task = make_task()

    def second() -> int | str:
        try:
            item_register_started(
                task_id=task.pk,
                actor="gateway:mcp",
                kind=Kind.REMOTE_TOOL,
                noun="tools: send",
                mechanism="mcp",
                detail={"gateway": IDENTICAL},
                submit_key="k-second",
                hold=retry_hold(task_id=task.pk, **IDENTICAL),
            )
        except Held as held:
            return held.item_id
        return "registered"

    first_item, held_by = _second_copy_behind_the_gate(task, second)
    assert held_by == first_item
    assert WorkItem.objects.filter(task=task).count() == 1  # the held copy wrote nothing


@pytest.mark.django_db(transaction=True)
def test_the_registration_with_the_retry_gate_as_its_hold_holds_an_identical_call_on_either_database():
    # The gateway's path: one statement on PostgreSQL, the portable transaction on SQLite.
    from stopdesk.gateway.retry_gate import retry_hold
    from stopdesk.services.errors import Held
    from stopdesk.services.items import item_register_started

    task = make_task()
    facts = {"upstream": "tools", "tool": "send", "arguments_sha256": "h1"}

    def register(key: str) -> int | None:
        return item_register_started(
            task_id=task.pk,
            actor="gateway:mcp",
            kind=Kind.REMOTE_TOOL,
            noun="tools: send",
            mechanism="mcp",
            detail={"gateway": facts},
            submit_key=key,
            hold=retry_hold(task_id=task.pk, upstream="tools", tool="send", arguments_sha256="h1"),
        )

    first = register("k-1")
    with pytest.raises(Held) as held:
        register("k-2")
    assert held.value.item_id == first
    assert list(WorkItem.objects.filter(task=task).values_list("pk", "state")) == [(first, S.RUNNING)]
    item_transition(item_id=first, to_state=S.FAILED, actor="gateway:mcp")  # found not to have taken effect
    second = register("k-3")
    assert second is not None and second != first
