"""An MCP server and an external system named only in STOPDESK_CONFIG_FILE are usable end to end:
the agent side calls them by name and the reconciler reaches them (it reaches only configured
ones), against the sandbox parties on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from django.db import connection

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.agent import http_submit
from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.mechanisms.mcp.agent import mcp_call_tool
from reconcile.mechanisms.mcp.sandbox import MCPToolServer
from reconcile.services.cancel import item_cancel
from stopdesk import config_file
from stopdesk.models import ExternalRecord
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.reconcile.helpers import abandoned_task, stop

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def parties() -> Iterator[tuple[MCPToolServer, str, CRM, str]]:
    mcp, crm = MCPToolServer(default_seconds=2.0, poll_interval_ms=50), CRM()
    with BackgroundServer(mcp.app, name="mcp") as mcp_server, BackgroundServer(crm.app, name="crm") as crm_server:
        yield mcp, mcp_server.url + "/mcp", crm, crm_server.url


@pytest.fixture
def from_file(settings, parties, tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """The settings as start-up builds them with a file naming the server "research" and the
    system "billing" (neither is in the settings module), and the file's timing for both."""
    _mcp, mcp_url, _crm, crm_url = parties
    monkeypatch.setenv("RESEARCH_MCP_KEY", "team-ops")
    path = tmp_path / "stopdesk.toml"
    path.write_text(
        f"""
[mechanisms.mcp]
call_timeout_s = 1
deadline_s = 10
recheck_interval_s = 0.5

[mechanisms.http]
call_timeout_s = 0.5
deadline_s = 20

[mcp.servers.research]
url = "{mcp_url}"
headers_env = {{ "X-Team" = "RESEARCH_MCP_KEY" }}

[http.systems.billing]
base_url = "{crm_url}"
lookup_url = "/records?idempotency_key={{idempotency_key}}"
record_url = "/records/{{record_id}}"
version_field = "version"

[http.systems.billing.reverse]
action = "archive"
label = "Archive the record"
url = "/records/{{record_id}}/archive"
if_match = '"v{{version}}"'
"""
    )
    settings.STOPDESK_MECHANISMS = config_file.merged(settings.STOPDESK_MECHANISMS, str(path), environment={})
    registry.reset()
    yield
    registry.reset()


def test_the_file_gives_the_adapters_its_server_system_and_timing(from_file, parties):
    _mcp, mcp_url, _crm, crm_url = parties
    mcp, http = registry.mechanism_settings("mcp"), registry.mechanism_settings("http")
    assert (mcp.call_timeout_s, mcp.deadline_s, http.deadline_s) == (1.0, 10.0, 20.0)
    assert mcp.options["servers"]["research"] == {"url": mcp_url, "headers": {"X-Team": "team-ops"}}
    assert http.options["systems"]["billing"]["base_url"] == crm_url


def test_an_mcp_server_named_only_in_the_file_is_called_by_name(from_file, parties):
    _party, url, _crm, _crm_url = parties
    task = make_task()
    item = item_register(task=task, kind=Kind.REMOTE_TOOL, noun="lookup", actor="test", mechanism="mcp")

    async def call():  # type: ignore[no-untyped-def]
        return await mcp_call_tool(
            item_id=item.pk,
            server="research",
            tool=tools.SLOW_LOOKUP,
            arguments={"query": "q", "seconds": 0.05},
            actor="agent",
            poll_s=0.05,
        )

    try:
        result = anyio.run(call)
    finally:
        connection.close()
    assert result is not None and not result.is_error
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert (item.detail["mcp"]["server"], item.detail["mcp"]["url"]) == ("research", url)
    assert "team-ops" not in str(item.detail), "a header's value is a secret, never recorded"


def test_the_reconciler_reaches_the_file_named_mcp_server_to_cancel_a_task(from_file, parties):
    """A task whose owner is gone: the reconciler resumes its session at the server the file names."""
    party, url, _crm, _crm_url = parties
    task = make_task()
    item = item_register(task=task, kind=Kind.REMOTE_TOOL, noun="export", actor="test", mechanism="mcp")
    task_id = abandoned_task(url, item, server="research")
    try:
        task_request_stop_and_cancel(task, item)
    finally:
        connection.close()
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["detail"]["cancel"] == "accepted (resumed session)"
    assert [t["status"] for t in party.tasks() if t["taskId"] == task_id] == ["cancelled"]


def task_request_stop_and_cancel(task, item) -> None:  # type: ignore[no-untyped-def]
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    item_cancel(item_id=item.pk)


def test_a_system_named_only_in_the_file_is_looked_up_and_reversible(
    from_file, parties, django_capture_on_commit_callbacks
):
    """The action's answer is lost; after Stop the reconciler finds the record through the lookup
    the file declares, with the file's reversal."""
    _mcp, _url, crm, base = parties
    crm.set_fault("hang_after_commit", target="key-1")
    task = make_task()
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="invoice", actor="test", mechanism="http")
    submitted = http_submit(
        item_id=item.pk,
        actor="test",
        idempotency_key="key-1",
        url=base + "/records",
        json={"name": "ACME"},
        declaration={"system": "billing", "effect": "created"},
        timeout_s=0.3,
    )
    assert not submitted.accepted
    assert stop(task, django_capture_on_commit_callbacks) == [item.pk]
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    record = ExternalRecord.objects.get(item=item)
    assert (record.system, record.record_id, record.version, record.reversal) == ("billing", "crm-1", "1", "archive")
    assert crm.counts.count("create", "key-1") == 1
