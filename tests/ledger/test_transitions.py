"""`stopdesk.services.transitions`, the one place that writes an item's state with its event. These
tests run on PostgreSQL (`make test`) and on SQLite (`make test-sqlite`), so both the statements
built for PostgreSQL and their portable twins are exercised."""

from __future__ import annotations

import ast
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from reconcile.services.reconcile import _late_result
from stopdesk.models import Event, WorkItem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import item_finish, item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import (
    NOW,
    Row,
    Schedule,
    item_observed_started,
    item_transition,
    items_move,
    items_schedule,
)
from stopdesk.states import ItemState as S
from stopdesk.states import Kind
from tests.factories import make_item, make_task

ROOT = Path(__file__).parents[2]


@pytest.mark.django_db
def test_the_suite_runs_on_the_database_it_was_asked_for():
    # `make test-sqlite` sets this, so the SQLite run cannot quietly run on PostgreSQL.
    expected = os.environ.get("STOPDESK_EXPECT_DB")
    if expected:
        assert connection.vendor == expected
    assert connection.vendor in ("postgresql", "sqlite")


@pytest.mark.django_db
def test_a_transition_writes_the_state_and_its_event_together():
    item = make_item(make_task(), state=S.RUNNING)
    moved = item_transition(item_id=item.pk, to_state=S.AWAITING_RECONCILIATION, actor="t", outcome="sent; no answer")
    assert moved.state == S.AWAITING_RECONCILIATION
    event = Event.objects.get(item=item, to_state=S.AWAITING_RECONCILIATION)
    assert (event.from_state, event.message, event.actor) == (S.RUNNING, "sent; no answer", "t")


@pytest.mark.django_db
def test_a_transition_the_ledger_does_not_allow_writes_nothing():
    item = make_item(make_task(), state=S.COMPLETED)
    before = Event.objects.filter(item=item).count()
    with pytest.raises(IllegalTransition):
        item_transition(item_id=item.pk, to_state=S.RUNNING, actor="t")
    item.refresh_from_db()
    assert item.state == S.COMPLETED and Event.objects.filter(item=item).count() == before


@pytest.mark.django_db
def test_a_transition_may_set_only_the_allowed_fields():
    item = make_item(make_task(), state=S.RUNNING)
    with pytest.raises(ValueError, match="may not set started_at"):
        item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="t", started_at=None)
    item.refresh_from_db()
    assert item.state == S.RUNNING and item.started_at is not None
    due = timezone.now() + timedelta(minutes=5)
    item_transition(item_id=item.pk, to_state=S.AWAITING_RECONCILIATION, actor="t", next_check_at=due)
    item.refresh_from_db()
    assert item.next_check_at == due


@pytest.mark.django_db
def test_a_set_based_move_writes_one_event_per_item_and_checks_the_from_state():
    task = make_task()
    queued = [make_item(task) for _ in range(3)]
    running = make_item(task, state=S.RUNNING)
    moved = items_move(
        where=Q(task=task),
        from_states=(S.QUEUED,),
        to_state=S.CANCELLED,
        actor="t",
        kind="stop_cancelled",
        message="Cancelled by Stop before it started.",
        sets={"outcome": "cancelled before it started"},
        return_ids=True,
    )
    assert sorted(moved) == sorted(i.pk for i in queued)
    assert set(WorkItem.objects.filter(pk__in=moved).values_list("state", flat=True)) == {S.CANCELLED}
    events = Event.objects.filter(kind="stop_cancelled", task=task)
    assert sorted(e.item_id for e in events) == sorted(moved)
    assert {(e.from_state, e.to_state) for e in events} == {(S.QUEUED, S.CANCELLED)}
    running.refresh_from_db()
    assert running.state == S.RUNNING


@pytest.mark.django_db
def test_a_set_based_move_carries_each_items_own_values():
    task = make_task()
    a, b = make_item(task, state=S.RUNNING), make_item(task, state=S.RUNNING)
    soon = timezone.now() + timedelta(seconds=30)
    later = soon + timedelta(seconds=30)
    moved = items_move(
        where=Q(),
        from_states=(S.RUNNING,),
        to_state=S.AWAITING_RECONCILIATION,
        actor="t",
        kind="transition",
        message="reconciling",
        rows={a.pk: Row(sets={"next_check_at": soon}, evidence={"n": 1}), b.pk: Row(sets={"next_check_at": later})},
        return_ids=True,
    )
    assert sorted(moved) == sorted([a.pk, b.pk])
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.next_check_at, a.evidence.get("n")) == (soon, 1)
    assert (b.next_check_at, b.evidence.get("n")) == (later, None)


@pytest.mark.django_db
def test_a_set_based_move_refuses_fields_outside_the_allow_list_and_moves_nothing():
    task = make_task()
    item = make_item(task)
    with pytest.raises(ValueError, match="may not set"):
        items_move(
            where=Q(task=task),
            from_states=(S.QUEUED,),
            to_state=S.CANCELLED,
            actor="t",
            kind="x",
            message="",
            sets={"started_at": NOW},
        )
    with pytest.raises(ValueError, match="not one allowed move"):
        items_move(where=Q(task=task), from_states=(S.QUEUED,), to_state=S.COMPLETED, actor="t", kind="x", message="")
    item.refresh_from_db()
    assert item.state == S.QUEUED and not Event.objects.filter(item=item, kind="x").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("door", ["item_finish", "reconcile"])
def test_a_late_result_is_an_event_and_a_review_flag_never_an_overwrite(door):
    item = make_item(make_task(), state=S.RUNNING)
    item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="stop")
    if door == "item_finish":
        item_finish(item_id=item.pk, succeeded=True, actor="worker", outcome="done after all")
    else:
        _late_result(item_id=item.pk, reported=S.COMPLETED, actor="reconciler", outcome="done after all", evidence={})
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.needs_review
    assert item.evidence["late_result"]["reported"] == S.COMPLETED
    late = Event.objects.get(item=item, kind="late_result")
    assert (late.from_state, late.to_state, late.data["reported"]) == (S.CANCELLED, S.CANCELLED, S.COMPLETED)


@pytest.mark.django_db
def test_a_late_cancelled_report_for_a_completed_item_is_kept_for_review():
    item = make_item(make_task(), state=S.COMPLETED)
    _late_result(item_id=item.pk, reported=S.CANCELLED, actor="reconciler", outcome="cancelled", evidence={"x": 1})
    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.needs_review
    assert Event.objects.get(item=item, kind="late_result").data["evidence"] == {"x": 1}


@pytest.mark.django_db
def test_scheduling_writes_only_where_the_state_is_still_the_one_decided_on():
    task = make_task()
    still, moved_meanwhile = make_item(task, state=S.RUNNING), make_item(task, state=S.RUNNING)
    item_transition(item_id=moved_meanwhile.pk, to_state=S.CANCELLED, actor="worker")
    due = timezone.now() + timedelta(seconds=5)
    written = items_schedule(
        {
            still.pk: Schedule(S.RUNNING, due, {"failures": 1}),
            moved_meanwhile.pk: Schedule(S.RUNNING, due, {"failures": 1}),
        }
    )
    assert written == {still.pk}
    still.refresh_from_db()
    moved_meanwhile.refresh_from_db()
    assert still.next_check_at == due and still.evidence["reconcile"] == {"failures": 1}
    assert moved_meanwhile.next_check_at is None and "reconcile" not in moved_meanwhile.evidence


# --- checked in the source ----------------------------------------------------------------------
# Writes of a state from outside its writer are caught by the suite's SQL guard (tests/state_guard.py,
# tested in test_state_guard.py), whatever their spelling; what is left here reads the source for
# what SQL cannot show: who appends events, and where states are named.

EVENTS = ROOT / "stopdesk" / "services" / "events.py"
WRITER = ROOT / "stopdesk" / "services" / "transitions"
# The audit trail's triggers (DDL the database runs on every writer's insert), not a writer.
AUDIT_TRIGGERS = ROOT / "stopdesk" / "audit_db.py"
STATE_NAMES = {"state", "state__in", "to_state", "from_state", "from_states", "allowed_from"}
INSERTS_EVENT = re.compile(r"INSERT INTO stopdesk_event\s*\(")
SQL_STATE = re.compile(r"'(" + "|".join(map(re.escape, S.values)) + r")'")


def _product_modules():
    for package in ("stopdesk", "reconcile"):
        for path in sorted((ROOT / package).rglob("*.py")):
            # The sandbox is the outside world (its own vocabularies); migrations are history.
            if "migrations" in path.parts or "sandbox" in path.parts:
                continue
            yield path, ast.parse(path.read_text(), filename=str(path))


def test_no_module_but_transitions_and_events_appends_an_event():
    found = []
    for path, tree in _product_modules():
        if WRITER in path.parents or path in (EVENTS, AUDIT_TRIGGERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = ast.unparse(node.func.value)
                if node.func.attr in ("create", "bulk_create") and receiver.startswith("Event"):
                    found.append(f"{path.name}:{node.lineno} appends an Event")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and INSERTS_EVENT.search(node.value):
                found.append(f"{path.name}:{node.lineno} appends events in SQL")
    assert found == []


def test_states_are_named_in_states_py_only():
    found = []
    for path, tree in _product_modules():
        if path == ROOT / "stopdesk" / "states.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_STATE.search(node.value):
                found.append(f"{path.name}:{node.lineno} SQL literal {SQL_STATE.search(node.value).group(0)}")
            if isinstance(node, ast.keyword) and node.arg in STATE_NAMES and _literal_states(node.value):
                found.append(f"{path.name}:{node.lineno} {node.arg}={_literal_states(node.value)}")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_a_state(s) for s in sides):
                    found += [
                        f"{path.name}:{node.lineno} compares with {_literal_states(s)}"
                        for s in sides
                        if _literal_states(s)
                    ]
    assert found == []


def _literal_states(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(S.values)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {v for e in node.elts for v in _literal_states(e)}
    if isinstance(node, ast.Call) and node.args:
        return _literal_states(node.args[0])
    return set()


def _names_a_state(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.endswith("state")


def test_the_source_checks_can_fail():
    # The checks above read real syntax: a literal state in a comparison is found.
    tree = ast.parse('if item.state == "running":\n    item.state = "queued"\n')
    compare = next(n for n in ast.walk(tree) if isinstance(n, ast.Compare))
    assert _names_a_state(compare.left) and _literal_states(compare.comparators[0]) == {"running"}


@pytest.mark.django_db
def test_work_found_running_after_stop_is_recorded_running_from_when_it_began():
    task = make_task()
    response = make_item(task, state=S.RUNNING, mechanism="openai")
    task_request_stop(task_id=task.pk, actor="operator", dispatch=lambda ids: None)

    launched = item_register(
        task=task, parent=response, kind=Kind.REMOTE_TOOL, noun="hosted tool call", actor="t", observed=True
    )

    task.refresh_from_db()
    response.refresh_from_db()
    assert launched.state == S.RUNNING  # it ran: Stop after it began does not refuse it
    assert launched.started_at == response.started_at < task.stop_requested_at
    moves = list(Event.objects.filter(item=launched).order_by("id").values_list("kind", "from_state", "to_state"))
    assert moves == [("item_registered", "", S.QUEUED), ("observed_started", S.QUEUED, S.RUNNING)]


@pytest.mark.django_db
def test_work_found_running_keeps_the_start_its_finder_knows():
    task = make_task()
    began = timezone.now() - timedelta(minutes=3)
    launched = item_register(
        task=task, kind=Kind.REMOTE_TOOL, noun="hosted tool call", actor="t", observed=True, started_at=began
    )
    assert (launched.state, launched.started_at) == (S.RUNNING, began)
    with pytest.raises(IllegalTransition):
        item_observed_started(item_id=launched.pk, actor="t", started_at=began)  # only from queued


def _stop_committed_not_fanned_out(task) -> None:  # type: ignore[no-untyped-def]
    """The stop request committed; its fan-out has not run (a process between the two steps)."""
    from stopdesk.services.stop import _commit_stop_request

    _, created = _commit_stop_request(task_id=task.pk, actor="user:operator", by=None, reason="")
    assert created


@pytest.mark.django_db
def test_a_settle_of_an_item_stop_met_in_flight_carries_stops_stamp_and_its_event():
    task, other = make_task(), make_task()
    met, untouched = make_item(task, state=S.RUNNING), make_item(other, state=S.RUNNING)
    _stop_committed_not_fanned_out(task)
    for item in (met, untouched):
        item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="agent", outcome="stopped between steps")
    met.refresh_from_db()
    task.refresh_from_db()
    assert met.cancel_requested_at == task.stop_requested_at
    assert WorkItem.objects.get(pk=untouched.pk).cancel_requested_at is None
    kinds = list(Event.objects.filter(item=met).order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == ["cancel_requested", "transition"]
    assert not Event.objects.filter(item=untouched, kind="cancel_requested").exists()


@pytest.mark.django_db
def test_a_set_based_settle_of_items_stop_met_in_flight_carries_the_stamp_once():
    task, other = make_task(), make_task()
    met = [make_item(task, state=S.RUNNING) for _ in range(2)]
    stamped = make_item(task, state=S.RUNNING)
    untouched = make_item(other, state=S.RUNNING)
    _stop_committed_not_fanned_out(task)
    earlier = timezone.now() - timedelta(minutes=1)
    WorkItem.objects.filter(pk=stamped.pk).update(cancel_requested_at=earlier)  # as the fan-out left it
    items_move(
        where=Q(task__in=[task.pk, other.pk]),
        from_states=(S.RUNNING,),
        to_state=S.CANCELLED,
        actor="reconciler",
        kind="reconciled",
        message="cancelled",
    )
    task.refresh_from_db()
    stamps = dict(WorkItem.objects.values_list("pk", "cancel_requested_at"))
    assert [stamps[i.pk] for i in met] == [task.stop_requested_at] * 2
    assert (stamps[stamped.pk], stamps[untouched.pk]) == (earlier, None)
    events = Event.objects.filter(kind="cancel_requested")
    assert sorted(events.values_list("item_id", flat=True)) == sorted(i.pk for i in met)
    assert set(WorkItem.objects.values_list("state", flat=True)) == {S.CANCELLED}
