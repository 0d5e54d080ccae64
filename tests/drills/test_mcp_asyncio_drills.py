"""Drill drivers for MCP tool calls and asyncio children, on the sandbox.

What holds is asserted as holding; what the drills showed does not hold (an effect the ledger
records as cancelled or failed) is asserted as a failed drill with the checker's own words, so a
fix in the mechanism turns these tests red on purpose and the expectation moves with it."""

from __future__ import annotations

import pytest

from reconcile.drills.runner import run_drills
from reconcile.drills.table import table

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def by_drill(report):  # type: ignore[no-untyped-def]
    return {o.drill: o for o in report.outcomes}


def test_mcp_plain_calls_and_tasks_hold_when_stopped(drill_sandbox):
    report = run_drills(
        mechanisms=["mcp"],
        drills=["before_dispatch", "during_tool_call", "after_acceptance", "duplicate_stop"],
        sandbox=drill_sandbox,
        store=False,
    )

    assert report.passed, table(report)
    rows = by_drill(report)
    assert rows["before_dispatch"].external_actions == 0
    assert rows["during_tool_call"].observed == "lookup cancelled; write uncertain; export task cancelled"
    assert rows["after_acceptance"].observed == "write uncertain; export task cancelled"
    # Each tools/call reached the server tagged with its item (`_meta.stopdesk_item`).
    assert rows["during_tool_call"].external_actions == 3


def test_mcp_server_down_and_disconnected_client_end_uncertain(drill_sandbox):
    report = run_drills(
        mechanisms=["mcp"], drills=["disconnected_client", "cancel_endpoint_down"], sandbox=drill_sandbox, store=False
    )

    assert report.passed, table(report)
    assert [o.observed for o in report.outcomes] == ["uncertain", "uncertain"]
    assert drill_sandbox.sandbox.servers["mcp"].running, "the drill restarts the server it stopped"


def test_an_mcp_task_that_ignores_tasks_cancel_is_a_failed_drill(drill_sandbox):
    # tasks/cancel answers `cancelled` and tasks/get keeps saying so (the spec keeps it cancelled),
    # while the export runs on and lands. The ledger records cancelled: the checker sees the export.
    report = run_drills(mechanisms=["mcp"], drills=["slow_child"], sandbox=drill_sandbox, store=False)

    outcome = report.outcomes[0]
    assert outcome.verdict == "FAIL", table(report)
    assert outcome.observed == "export task cancelled; write uncertain"
    assert outcome.lost == 1 and outcome.after_boundary == 0
    assert any("export_report exported" in v and "ledger records cancelled" in v for v in outcome.violations)
    effects = drill_sandbox.sandbox.mcp.effects()
    assert {e["tool"] for e in effects} == {"export_report", "slow_write"}, "both effects landed after the cancel"


def test_asyncio_children_hold_when_stopped(drill_sandbox):
    report = run_drills(
        mechanisms=["asyncio"],
        drills=["before_dispatch", "during_tool_call", "after_acceptance", "cancel_endpoint_down", "duplicate_stop"],
        sandbox=drill_sandbox,
        store=False,
    )

    assert report.passed, table(report)
    rows = by_drill(report)
    assert rows["before_dispatch"].external_actions == 0
    assert rows["during_tool_call"].observed == "record completed; computation cancelled"
    assert rows["cancel_endpoint_down"].observed == "record uncertain; computation cancelled"


def test_asyncio_effects_the_ledger_denies_are_failed_drills(drill_sandbox):
    report = run_drills(
        mechanisms=["asyncio"], drills=["slow_child", "disconnected_client"], sandbox=drill_sandbox, store=False
    )

    rows = by_drill(report)
    slow, gone = rows["slow_child"], rows["disconnected_client"]
    # A send that lands after the lookup said "not found" (past the adapter's call timeout): the
    # adapter settles cancelled and never looks again. The overrunning cleanup is uncertain.
    assert slow.verdict == "FAIL" and slow.observed == "message cancelled; computation uncertain", table(report)
    assert any("ledger records cancelled" in v for v in slow.violations)
    # A child that raised (its HTTP client timed out) after submit() is recorded failed, though
    # the CRM completed the create.
    assert gone.verdict == "FAIL" and gone.observed.startswith("record failed"), table(report)
    assert any("ledger records failed" in v for v in gone.violations)
