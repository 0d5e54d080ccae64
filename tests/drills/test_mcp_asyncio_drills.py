"""Drill drivers for MCP tool calls and asyncio children, on the sandbox.

The first run of these drills found three places where the ledger denied an effect the external
system held (an MCP task read back `cancelled` while its export landed; an asyncio send found
after its lookup said "not found"; an asyncio child recorded failed after its create went
through). Each was fixed in its mechanism, and each is asserted here as holding."""

from __future__ import annotations

import threading

import pytest

from stopdrill.drills.runner import run_drills
from stopdrill.drills.table import table

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
    # The threads that owned the drills' MCP tasks ended before the drills did: left running, they
    # wrote on their items after the run was over.
    assert [t.name for t in threading.enumerate() if t.name.startswith("mcp-task-owner-")] == []
    rows = by_drill(report)
    assert rows["before_dispatch"].external_actions == 0
    # A task read back `cancelled` proves nothing about a tool that is not read-only.
    assert rows["during_tool_call"].observed == "lookup cancelled; write uncertain; export task uncertain"
    assert rows["after_acceptance"].observed == "write uncertain; export task uncertain"
    # Each tools/call reached the server tagged with its item (`_meta.stopdesk_item`).
    assert rows["during_tool_call"].external_actions == 3


def test_mcp_server_down_and_disconnected_client_end_uncertain(drill_sandbox):
    report = run_drills(
        mechanisms=["mcp"], drills=["disconnected_client", "cancel_endpoint_down"], sandbox=drill_sandbox, store=False
    )

    assert report.passed, table(report)
    assert [o.observed for o in report.outcomes] == ["uncertain", "uncertain"]
    assert drill_sandbox.sandbox.servers["mcp"].running, "the drill restarts the server it stopped"


# 2025-11-25: tasks/cancel answers `cancelled` and tasks/get keeps saying so (the spec keeps it
# cancelled) while the export runs on and lands: uncertain. 2026-07-28: the acknowledgement is
# empty, the task stays `working` and its read-back ends `completed`, which is what happened.
SLOW_EXPORT = {"2025-11-25": "export task uncertain; write uncertain", "both": "export task completed; write uncertain"}


@pytest.mark.parametrize("speaks", sorted(SLOW_EXPORT))
def test_an_mcp_task_that_ignores_tasks_cancel_is_never_recorded_cancelled(drill_sandbox, speaks):
    party = drill_sandbox.sandbox.mcp
    party.configure(revisions=speaks)
    try:
        report = run_drills(mechanisms=["mcp"], drills=["slow_child"], sandbox=drill_sandbox, store=False)
    finally:
        party.configure(revisions="both")

    outcome = report.outcomes[0]
    assert outcome.verdict == "pass", table(report)
    assert outcome.observed == SLOW_EXPORT[speaks]
    assert outcome.lost == 0 and outcome.after_boundary == 0 and not outcome.violations
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
    # The threads that owned the drills' MCP tasks ended before the drills did: left running, they
    # wrote on their items after the run was over.
    assert [t.name for t in threading.enumerate() if t.name.startswith("mcp-task-owner-")] == []
    rows = by_drill(report)
    assert rows["before_dispatch"].external_actions == 0
    assert rows["during_tool_call"].observed == "record completed; computation cancelled"
    assert rows["cancel_endpoint_down"].observed == "record uncertain; computation cancelled"


def test_asyncio_effects_that_land_late_or_after_an_error_are_not_denied(drill_sandbox):
    report = run_drills(
        mechanisms=["asyncio"], drills=["slow_child", "disconnected_client"], sandbox=drill_sandbox, store=False
    )

    rows = by_drill(report)
    slow, gone = rows["slow_child"], rows["disconnected_client"]
    # A send that lands after the lookup said "not found": the watch after `cancelled` sees it
    # land, and it becomes a late result for review. The overrunning cleanup is uncertain.
    assert slow.verdict == "pass" and not slow.violations, table(report)
    assert slow.observed == "message cancelled, review; computation uncertain", table(report)
    # A child that raised (its HTTP client timed out) after submit(): reconciled, not "failed".
    assert gone.verdict == "pass" and not gone.violations, table(report)
    assert not gone.observed.startswith("record failed"), table(report)
