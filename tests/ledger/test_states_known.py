"""Every state is known to every part that must handle it: the summary, the task page's groups,
the reconciliation engine and the sweep. Adding a state without teaching one of them fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconcile import engine
from reconcile.mechanisms.base import LEDGER_FINAL, MechanismSettings, Observation, Seen
from reconcile.services.reconcile import items_claim_due
from stopdesk.states import (
    IN_FLIGHT,
    RECONCILABLE,
    SETTLED,
    SWEPT,
    TERMINAL,
    TRANSITIONS,
    UNSTARTED,
    ItemState,
    Kind,
)
from stopdesk.summary import compose
from stopdesk.views.selectors import GROUP_ORDER
from tests.factories import make_item, make_task

STATES = list(ItemState)
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_every_state_has_exactly_one_role_and_its_moves():
    for state in STATES:
        roles = [
            name
            for name, members in (("unstarted", UNSTARTED), ("in flight", IN_FLIGHT), ("settled", SETTLED))
            if state in members
        ]
        assert len(roles) == 1, (state, roles)
        assert state in TRANSITIONS, state
    assert set(LEDGER_FINAL) == set(TERMINAL)


@pytest.mark.parametrize("state", STATES)
def test_the_summary_tells_an_item_in_every_state(state):
    row = {"state": state, "noun": "widget", "noun_plural": "widgets", "kind": Kind.LOCAL_WORKER, "n": 1}
    assert "One widget" in compose([row], [], stopped=True)


def test_the_task_page_groups_and_colours_every_state():
    assert sorted(GROUP_ORDER) == sorted(STATES) and len(GROUP_ORDER) == len(STATES)
    css = (Path(__file__).parents[2] / "stopdesk" / "static" / "stopdesk" / "app.css").read_text()
    for state in STATES:
        assert f".pill.{state}" in css, state


@pytest.mark.parametrize("state", STATES)
def test_the_engine_decides_for_every_state_that_crossed_the_boundary(state):
    facts = engine.ItemFacts(state=state, cancel_requested=True, since=NOW - timedelta(seconds=1), cancelled_at=NOW)
    completed = Observation(Seen.COMPLETED, remote_status="completed")
    if state in UNSTARTED:
        with pytest.raises(ValueError, match="does not reconcile"):
            engine.decide(facts, completed, NOW, MechanismSettings())
        return
    plan = engine.decide(facts, completed, NOW, MechanismSettings())
    if state in TERMINAL:
        # Only watched: a contradicting answer is a late result, never a move.
        assert plan.to_state is None
        assert plan.late_result == (None if state == ItemState.COMPLETED else ItemState.COMPLETED)
    else:
        assert state in RECONCILABLE and plan.to_state == ItemState.COMPLETED


@pytest.mark.django_db
@pytest.mark.parametrize("state", STATES)
def test_the_sweep_picks_up_every_due_item_that_crossed_the_boundary(state):
    item = make_item(make_task(), state=state)
    assert item.state == state
    type(item).objects.filter(pk=item.pk).update(next_check_at=NOW - timedelta(seconds=1))
    claimed = items_claim_due(now=NOW)
    assert (item.pk in claimed) == (state in SWEPT)
    assert (state in SWEPT) == (state not in UNSTARTED)
