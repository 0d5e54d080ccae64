"""Tool readiness: verdicts from capabilities and the latest drill, the page, and the policy that
refuses to register work a tool cannot account for."""

from __future__ import annotations

import logging

import pytest

from reconcile import readiness
from reconcile.models import DrillResult, DrillRun
from stopdesk.models import Runtime, WorkItem
from stopdesk.services.errors import ToolNotReady
from stopdesk.services.items import item_register
from stopdesk.states import Kind
from tests.factories import make_task

pytestmark = pytest.mark.django_db

CRM = {"system": "crm"}  # configured in settings, with a lookup


def drilled(mechanism: str, *, failed: tuple[str, ...] = ()) -> DrillRun:
    run = DrillRun.objects.create(passed=not failed)
    for drill in ("before_dispatch", "duplicate_stop"):
        DrillResult.objects.create(
            run=run, drill=drill, mechanism=mechanism, expected="x", observed="x", passed=drill not in failed
        )
    return run


def by_tool() -> dict[str, readiness.Verdict]:
    return {v.tool: v for v in readiness.verdicts()}


def test_a_mechanism_without_a_status_lookup_is_not_ready():
    verdict = by_tool()["manual"]

    assert verdict.status == readiness.NOT_READY
    assert not verdict.inspect
    assert any("inspect" in r for r in verdict.reasons)


def test_a_mechanism_that_can_look_up_is_untested_until_drilled_then_ready():
    assert by_tool()["openai"].status == readiness.UNTESTED

    drilled("openai")

    verdict = by_tool()["openai"]
    assert verdict.status == readiness.READY
    assert verdict.drill is not None and verdict.drill.passed == 2


def test_a_failed_latest_drill_makes_a_capable_mechanism_not_ready():
    drilled("openai")
    drilled("openai", failed=("before_dispatch",))

    verdict = by_tool()["openai"]
    assert verdict.status == readiness.NOT_READY
    assert "before_dispatch" in " ".join(verdict.reasons)


def test_registration_is_allowed_when_the_policy_is_off(settings):
    settings.STOPDESK_READINESS_POLICY = "off"

    item = item_register(task=make_task(), kind=Kind.LOCAL_WORKER, noun="job", actor="t", mechanism="manual")

    assert item.pk


def test_enforce_refuses_a_tool_without_a_status_lookup_naming_tool_and_capability(settings):
    settings.STOPDESK_READINESS_POLICY = "enforce"
    task = make_task()

    with pytest.raises(ToolNotReady) as refused:
        item_register(task=task, kind=Kind.LOCAL_WORKER, noun="job", actor="t", mechanism="manual")

    assert refused.value.tool == "manual"
    assert refused.value.missing == ["inspect"]
    assert "manual" in str(refused.value) and "inspect" in str(refused.value)
    assert not WorkItem.objects.filter(task=task).exists()


def test_enforce_judges_an_http_operation_by_its_declaration(settings):
    settings.STOPDESK_READINESS_POLICY = "enforce"
    task = make_task()

    # A system configured nowhere (settings declare "crm" with a lookup; this one has none).
    with pytest.raises(ToolNotReady) as refused:
        item_register(
            task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor="t", mechanism="http",
            detail={"http": {"system": "billing"}},
        )  # fmt: skip
    assert refused.value.tool == "http:billing" and refused.value.missing == ["inspect"]

    item = item_register(
        task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor="t", mechanism="http", detail={"http": CRM}
    )
    assert item.pk


def test_enforce_refuses_a_tool_that_failed_its_latest_drill(settings):
    settings.STOPDESK_READINESS_POLICY = "enforce"
    drilled("openai", failed=("before_dispatch",))

    with pytest.raises(ToolNotReady) as refused:
        item_register(task=make_task(), kind=Kind.MODEL_REQUEST, noun="draft", actor="t", mechanism="openai")

    assert refused.value.missing == ["a passing drill"]


def test_warn_logs_the_refusal_and_registers(settings, caplog):
    settings.STOPDESK_READINESS_POLICY = "warn"

    with caplog.at_level(logging.WARNING, logger="reconcile.readiness"):
        item = item_register(task=make_task(), kind=Kind.LOCAL_WORKER, noun="job", actor="t", mechanism="manual")

    assert item.pk
    assert "manual" in caplog.text and "inspect" in caplog.text


def test_the_runtime_api_answers_422_with_the_error_shape(settings, client):
    settings.STOPDESK_READINESS_POLICY = "enforce"
    runtime = Runtime(name="agent")
    token = runtime.issue_token()
    runtime.save()
    headers = {"Authorization": f"Bearer {token}"}
    task = client.post("/api/v1/tasks", {"title": "t"}, content_type="application/json", headers=headers).json()

    answer = client.post(
        f"/api/v1/tasks/{task['id']}/items",
        {"kind": "local_worker", "noun": "job", "mechanism": "manual"},
        content_type="application/json",
        headers=headers,
    )

    assert answer.status_code == 422
    body = answer.json()
    assert body["error"] == "tool_not_ready"
    assert body["field"] == "mechanism"
    assert "manual" in body["detail"] and "inspect" in body["detail"]
    assert not WorkItem.objects.exists()


def test_the_readiness_page_shows_verdicts_with_their_evidence(client, cast):
    drilled("openai", failed=("before_dispatch",))
    client.force_login(cast["admin"])

    page = client.get("/readiness/")

    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="tool-manual"' in html and "Not ready" in html
    assert "before_dispatch" in html and "FAIL" in html
    assert "Tool readiness" in html


GIT_SERVER = {
    "command": "mcp-server-git",
    "tools": {
        "git_commit": {
            "status_check": {
                "tool": "git_log",
                "arguments": {"repo_path": "{repo_path}"},
                "completed_if_contains": "Message: {message}",
            }
        },
        "git_push": {},
    },
}


def test_an_mcp_tool_with_a_status_check_can_account_for_its_calls_and_one_without_cannot(settings, client, cast):
    settings.STOPDESK_MECHANISMS = {"mcp": {"options": {"servers": {"git": GIT_SERVER}}}}
    drilled("mcp")

    verdicts = by_tool()
    commit, push = verdicts["mcp:git/git_commit"], verdicts["mcp:git/git_push"]
    assert commit.inspect and commit.status == readiness.LIMITED  # looked at, not cancelled from afar
    assert not push.inspect and push.status == readiness.NOT_READY
    assert any("no status check declared" in r for r in push.reasons)

    client.force_login(cast["admin"])
    html = client.get("/readiness/").content.decode()
    assert 'id="tool-mcpgitgit_commit"' in html and 'id="tool-mcpgitgit_push"' in html


def test_enforce_refuses_an_mcp_tool_without_a_status_check(settings):
    settings.STOPDESK_MECHANISMS = {"mcp": {"options": {"servers": {"git": GIT_SERVER}}}}
    settings.STOPDESK_READINESS_POLICY = "enforce"
    task = make_task()

    item_register(
        task=task, kind=Kind.REMOTE_TOOL, noun="commit", actor="a", mechanism="mcp",
        detail={"mcp": {"server": "git", "tool": "git_commit"}},
    )  # fmt: skip
    with pytest.raises(ToolNotReady) as refused:
        item_register(
            task=task, kind=Kind.REMOTE_TOOL, noun="push", actor="a", mechanism="mcp",
            detail={"mcp": {"server": "git", "tool": "git_push"}},
        )  # fmt: skip
    assert refused.value.tool == "mcp:git_push" and "inspect" in refused.value.missing
