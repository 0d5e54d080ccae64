"""stopdrill against a user's own integration: separately started sandbox parties treated as the
user's systems (no control route is used), reversible or read-only test actions only, and every
record the drills created ends archived."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command

from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.mcp.sandbox import MCP_PATH, MCPToolServer
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.models import DrillRun
from stopdrill.drills.external import NEEDS_CONTROLS, Integration
from stopdrill.drills.runner import run_drills
from stopdrill.drills.table import table
from stopdrill.sandbox.server import BackgroundServer

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def users_crm() -> Iterator[tuple[CRM, str]]:
    crm = CRM()
    with BackgroundServer(crm.app, name="users-crm") as server:
        yield crm, server.url


@pytest.fixture
def users_mcp() -> Iterator[tuple[MCPToolServer, str]]:
    party = MCPToolServer(default_seconds=2.0)
    with BackgroundServer(party.app, name="users-mcp") as server:
        yield party, server.url + MCP_PATH


@pytest.fixture
def users_openai() -> Iterator[str]:
    party = OpenAIStandin(queue_s=0.02, run_s=5.0)
    with BackgroundServer(party.app, name="users-openai") as server:
        yield server.url + "/v1"


def control_requests(party) -> int:  # type: ignore[no-untyped-def]
    return sum(n for endpoint, n in party.stats()["endpoints"].items() if endpoint.startswith("_control"))


def test_drills_on_a_users_crm_archive_every_record_they_created(users_crm):
    crm, url = users_crm
    report = run_drills(target=Integration(crm_url=url), store=False)

    assert report.passed, table(report)
    rows = {o.drill: o for o in report.outcomes}
    assert {d for d, o in rows.items() if o.passed is None} == {
        "slow_child",
        "disconnected_client",
        "cancel_endpoint_down",
    }
    assert all(o.notes == [NEEDS_CONTROLS] for o in rows.values() if o.passed is None)
    assert [
        rows[d].observed for d in ("before_dispatch", "during_tool_call", "after_acceptance", "duplicate_stop")
    ] == [
        "cancelled",
        "completed",
        "completed",
        "completed",
    ]
    records = crm.records()
    assert len(records) == 3, "one record per drill that dispatched; none for the stop before dispatch"
    assert all(r["status"] == "archived" for r in records), records
    # Archived from the version read just before, with If-Match.
    assert all(r["history"][-1]["action"] == "archive" and r["version"] == 2 for r in records)
    archived = [line for line in report.cleanup if line.startswith("archived record")]
    assert len(archived) == 3 and all("If-Match" in line for line in archived)
    assert any("nothing was created" in line for line in report.cleanup)
    assert "Reversed at the end" in table(report)
    assert control_requests(crm) == 0


def test_stopdrill_options_for_a_users_systems(users_crm, users_mcp, users_openai, capsys, tmp_path):
    crm, crm_url = users_crm
    mcp, mcp_url = users_mcp
    path = tmp_path / "RELIABILITY.md"

    call_command(
        "stopdrill",
        "--crm-url", crm_url,
        "--mcp-url", mcp_url, "--mcp-tool", "slow_lookup", "--mcp-arguments", '{"seconds": 1.5}',
        "--openai-base-url", users_openai, "--openai-api-key", "sk-secret-test",
        "--write-reliability", str(path),
    )  # fmt: skip

    printed = capsys.readouterr().out
    assert "FAIL" not in printed
    assert "not applicable: needs the sandbox's fault controls" in printed
    run = DrillRun.objects.get()
    assert run.passed is True and run.target.startswith("integration:")
    assert {r.mechanism for r in run.rows.all()} == {"http", "mcp", "openai"}
    assert all(r["status"] == "archived" for r in crm.records())
    assert mcp.effects() == [] and control_requests(mcp) == 0 and control_requests(crm) == 0
    text = path.read_text()
    assert "sk-secret-test" not in text
    assert "Reversed at the end" in text and "tests/faults" in text


def test_a_tool_that_is_not_read_only_is_refused_on_a_users_server(users_mcp):
    _mcp, url = users_mcp
    report = run_drills(target=Integration(mcp_url=url, mcp_tool="slow_write"), store=False)

    assert all(o.passed is None for o in report.outcomes)
    assert all("not annotated read-only" in o.notes[0] for o in report.outcomes)
    assert _mcp.counts.count("tools/call") == 0


def test_the_recorded_command_never_holds_the_api_key_or_a_path_outside_the_project(tmp_path):
    from django.conf import settings

    from stopdrill.management.commands.stopdrill import recorded_arguments

    options = {
        "mechanism": ["http"],
        "crm_url": "u",
        "openai_api_key": "sk-1",
        "openai_model": "gpt-4o-mini",
        "mcp_arguments": "{}",
        "write_reliability": str(settings.BASE_DIR / "docs" / "RELIABILITY.md"),
        "fault_results": str(tmp_path / "faults.xml"),
    }
    assert recorded_arguments(options) == [
        "--mechanism",
        "http",
        "--crm-url",
        "u",
        "--openai-api-key",
        "***",
        "--write-reliability",
        "--fault-results",
        "faults.xml",
    ]
    inside = {
        "write_reliability": str(settings.BASE_DIR / "build" / "R.md"),
        "fault_results": str(settings.BASE_DIR / "tests" / "x.xml"),
    }
    assert recorded_arguments(inside) == ["--write-reliability", "build/R.md", "--fault-results", "tests/x.xml"]
