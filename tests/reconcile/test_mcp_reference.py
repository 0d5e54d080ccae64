"""Stop against the official MCP reference servers: server-everything (npm, Streamable HTTP) and
mcp-server-git (PyPI, stdio). Each test checks the item's final state, what the server received
and answered (recorded on the wire by a proxy or a stdio tee), and the summary sentence."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.db import connection
from django.utils import timezone

from reconcile.mechanisms.mcp.agent import mcp_call_tool, mcp_start_task, task_owner
from reconcile.services.cancel import item_cancel
from reconcile.services.reconcile import sweep_once
from stopdesk.models import Event, WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState, Kind
from stopdesk.summary import task_summary
from tests.factories import make_task
from tests.reconcile.helpers import sweep_until_settled
from tests.reference_servers import crashing_pre_commit, git_log, read_wire, slow_pre_commit

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.reference_servers]
RESEARCH = "simulate-research-query"  # server-everything's task tool: 4 stages of 1 s


@pytest.fixture
def mcp_settings(settings):  # type: ignore[no-untyped-def]
    def configure(deadline_s: float = 8.0, recheck_interval_s: float = 0.5, **options: Any) -> None:
        settings.STOPDESK_MECHANISMS = {
            "mcp": {
                "call_timeout_s": 10.0,
                "deadline_s": deadline_s,
                "backoff_initial_s": 0.5,
                "recheck_interval_s": recheck_interval_s,
                "options": options,
            }
        }

    configure()
    return configure


def tool_item(task, noun):  # type: ignore[no-untyped-def]
    return item_register(task=task, kind=Kind.REMOTE_TOOL, noun=noun, actor="test", mechanism="mcp")


def fresh(task):  # type: ignore[no-untyped-def]
    """The task as the ledger has it now: the summary reads whether Stop was requested from it."""
    task.refresh_from_db()
    return task


def stop(task) -> None:  # type: ignore[no-untyped-def]
    try:
        task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    finally:
        connection.close()


def owner_done(item) -> None:  # type: ignore[no-untyped-def]
    owner = task_owner(item.pk)
    assert owner is not None and owner.join(20), "the task's session owner did not finish"


def wait_for(predicate, seconds=15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def state_of(item) -> str:  # type: ignore[no-untyped-def]
    try:
        return str(WorkItem.objects.values_list("state", flat=True).get(pk=item.pk))
    finally:
        connection.close()


def evidence_report(name: str, item: WorkItem, wire: Any, summary: str) -> None:
    """Printed for the record (pytest -s): the scenario's final state, wire and summary."""
    print(f"\n=== {name}\nstate: {item.state} | outcome: {item.outcome}\nsummary: {summary}")
    print("uncertain_because:", item.evidence.get("uncertain_because", ""))
    print("wire:", json.dumps(wire, indent=1, default=str)[:3000])


# --- server-everything: tasks live in the session that created them ----------------------------


def test_task_is_cancelled_mid_run_through_its_own_session(mcp_settings, everything_party):
    _server, wire, url = everything_party
    task = make_task()
    item = tool_item(task, "research")
    task_id = mcp_start_task(item_id=item.pk, url=url, tool=RESEARCH, arguments={"topic": "stop"}, actor="agent")
    time.sleep(1.2)  # mid-run: the second of four stages
    stop(task)
    item_cancel(item_id=item.pk)  # the reconciler: the owner is alive and cancels in its session
    owner_done(item)

    item.refresh_from_db()
    [created] = wire.received("tools/call")
    [cancel] = wire.received("tasks/cancel")
    assert cancel["session"] == created["session"] != ""
    [answer] = wire.answers_to(cancel)
    assert answer["msg"]["result"]["status"] == "cancelled"  # not -32602: it reached the task
    read_back = [wire.answers_to(g)[0]["msg"] for g in wire.received("tasks/get") if g["at"] > cancel["at"]]
    assert read_back and read_back[0]["result"]["status"] == "cancelled"
    assert all(g["session"] == created["session"] for g in wire.received("tasks/get"))
    # The tool is annotated not read-only; MCP keeps `cancelled` even if work went on.
    assert item.state == S.UNCERTAIN
    assert "whether it took effect is unknown" in item.evidence["uncertain_because"]
    assert item.handle == task_id
    summary = task_summary(fresh(task))
    assert summary.startswith("Stopped new work.")
    assert "review required" in summary
    evidence_report(
        "task cancelled mid-run through its own session",
        item,
        {"tasks/cancel": cancel["msg"], "answer": answer["msg"], "tasks/get after": read_back[0]},
        summary,
    )


def test_task_that_finished_before_stop_ends_completed(mcp_settings, everything_party):
    _server, wire, url = everything_party
    task = make_task()
    item = tool_item(task, "research")
    mcp_start_task(item_id=item.pk, url=url, tool=RESEARCH, arguments={"topic": "done"}, actor="agent")
    owner_done(item)  # the owner read `completed` in its session and recorded it
    stop(task)
    item_cancel(item_id=item.pk)

    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert wire.received("tasks/cancel") == []
    last_get = wire.received("tasks/get")[-1]
    assert wire.answers_to(last_get)[0]["msg"]["result"]["status"] == "completed"
    summary = task_summary(fresh(task))
    assert "review required" not in summary
    evidence_report(
        "task finished before Stop",
        item,
        {"last tasks/get": last_get["msg"], "answer": wire.answers_to(last_get)[0]["msg"]},
        summary,
    )


def test_progress_after_the_cancel_is_recorded_as_evidence(mcp_settings, everything_party):
    """server-everything keeps running its long operation after notifications/cancelled and keeps
    reporting progress; the item (read-only tool: cancelled) says so."""
    _server, wire, url = everything_party
    task = make_task()
    item = tool_item(task, "operation")
    results: list[Any] = []

    def agent() -> None:
        try:
            results.append(
                anyio.run(
                    lambda: mcp_call_tool(
                        item_id=item.pk,
                        server=url,
                        tool="trigger-long-running-operation",
                        arguments={"duration": 3, "steps": 6},
                        actor="agent",
                        poll_s=0.05,
                        after_cancel_s=3.0,
                    )
                )
            )
        finally:
            connection.close()

    thread = threading.Thread(target=agent)
    thread.start()
    assert wait_for(lambda: state_of(item) == S.RUNNING)  # the call passed the boundary
    time.sleep(1.0)
    stop(task)
    thread.join(20)

    item.refresh_from_db()
    assert results == [None] and item.state == S.CANCELLED
    seen = item.evidence["progress_after_cancel"]
    assert seen["count"] >= 1 and seen["note"] == "the server kept reporting progress after the cancel"
    [cancelled] = [m for m in wire.received() if m["msg"].get("method") == "notifications/cancelled"]
    later = [p for p in wire.notifications("notifications/progress") if p["at"] > cancelled["at"]]
    assert len(later) >= seen["count"]
    assert Event.objects.filter(item=item, kind="evidence").exists()
    evidence_report(
        "progress after the cancel",
        item,
        {"notifications/cancelled": cancelled["msg"], "progress after": [p["msg"] for p in later]},
        task_summary(fresh(task)),
    )


def test_a_call_to_server_everything_falls_back_to_2025_11_25_and_records_it(mcp_settings, everything_party):
    """server-everything speaks only 2025-11-25: the client's 2026-07-28 probe is refused (HTTP
    400), it falls back to the handshake, and the item says which revision was used and why."""
    _server, wire, url = everything_party
    task = make_task()
    item = tool_item(task, "echo")
    try:
        anyio.run(
            lambda: mcp_call_tool(item_id=item.pk, server=url, tool="echo", arguments={"message": "hi"}, actor="a")
        )
    finally:
        connection.close()
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    facts = item.detail["mcp"]
    assert (facts["revision"], facts["transport"]) == ("2025-11-25", "streamable_http")
    assert facts["negotiation"].startswith("fell back: the server refused 2026-07-28")
    assert facts["cancel_wire"] == "notifications/cancelled with the request id"
    received = [m["msg"].get("method") for m in wire.received()]
    assert received[:2] == ["server/discover", "initialize"]
    [probe] = wire.received("server/discover")
    refusals = [m["msg"] for m in wire.messages if m["dir"] == "out" and "error" in m["msg"] and m["at"] >= probe["at"]]
    assert refusals and "not initialized" in json.dumps(refusals[0]).lower()
    evidence_report("fallback to 2025-11-25 against server-everything", item, {"refusal": refusals[0]}, "")


def test_headers_and_bearer_token_reach_the_server_and_never_the_ledger_or_logs(
    mcp_settings, everything_party, monkeypatch, caplog
):
    _server, wire, url = everything_party
    token = "s3cret-token-for-the-test"
    monkeypatch.setenv("STOPDESK_TEST_MCP_TOKEN", token)
    mcp_settings(
        servers={
            "everything": {"url": url, "headers": {"X-Team": "ops"}, "bearer_token_env": "STOPDESK_TEST_MCP_TOKEN"}
        }
    )
    task = make_task()
    item = tool_item(task, "echo")
    caplog.set_level(logging.DEBUG)
    result = anyio.run(
        lambda: mcp_call_tool(item_id=item.pk, server="everything", tool="echo", arguments={"message": "hi"}, actor="a")
    )
    assert result is not None and not result.is_error

    assert all(h.get("authorization") == f"Bearer {token}" for h in wire.headers_seen)
    assert all(h.get("x-team") == "ops" for h in wire.headers_seen)
    item.refresh_from_db()
    recorded = json.dumps([item.detail, item.evidence, list(Event.objects.filter(item=item).values("message", "data"))])
    assert item.detail["mcp"]["server"] == "everything" and item.detail["mcp"]["url"] == url
    assert token not in recorded and "ops" not in recorded
    assert token not in caplog.text


# --- mcp-server-git over stdio -----------------------------------------------------------------


def run_agent_in_thread(item, arguments, results, errors, after_cancel_s):  # type: ignore[no-untyped-def]
    def agent() -> None:
        try:
            results.append(
                anyio.run(
                    lambda: mcp_call_tool(
                        item_id=item.pk,
                        server="git",
                        tool="git_commit",
                        arguments=arguments,
                        actor="agent",
                        poll_s=0.05,
                        after_cancel_s=after_cancel_s,
                    )
                )
            )
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=agent)
    thread.start()
    return thread


# mcp-server-git speaks both revisions: "auto" negotiates 2026-07-28, the pin keeps 2025-11-25.
GIT_REVISIONS = {"auto": "2026-07-28", "2025-11-25": "2025-11-25"}


@pytest.mark.parametrize("asked", sorted(GIT_REVISIONS))
def test_stdio_commit_cancelled_mid_flight_is_settled_by_its_status_check(mcp_settings, git_server, git_repo, asked):
    mcp_settings(servers={"git": {**git_server["config"], "revision": asked}})
    slow_pre_commit(git_repo, 4.0)
    message = f"agent commit {time.time_ns()}"
    task = make_task()
    item = tool_item(task, "commit")
    results: list[Any] = []
    errors: list[Exception] = []
    thread = run_agent_in_thread(item, {"repo_path": str(git_repo), "message": message}, results, errors, 6.0)
    assert wait_for(lambda: state_of(item) == S.RUNNING)  # the call passed the boundary
    time.sleep(0.6)  # the commit is in its pre-commit hook
    stop(task)
    assert wait_for(lambda: state_of(item) == S.UNCERTAIN), (state_of(item), errors, read_wire(git_server["wire"]))

    # The reconciler looks before the commit lands: not there yet, answer attached.
    sweep_once(now=timezone.now(), concurrency=1)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert "did not show" in item.evidence["last_look"]["message"]
    assert message not in item.evidence["last_look"]["detail"]["status_check"]["answer"]
    assert "status check (git_log) will look" in item.evidence["uncertain_because"]

    thread.join(20)
    assert results == [None] and errors == []
    assert git_log(git_repo)[0] == message  # the cancelled commit landed anyway
    assert wait_for(lambda: _sweep_settles(item), 10)

    item.refresh_from_db()
    assert item.state == S.COMPLETED and item.outcome == "completed; git_log shows it took effect"
    assert message in item.evidence["detail"]["status_check"]["answer"]
    everything_seen = read_wire(git_server["wire"])
    [call] = [m for m in everything_seen if m["dir"] == "in" and m["msg"].get("method") == "tools/call"
              and m["msg"]["params"]["name"] == "git_commit"]  # fmt: skip
    # The agent's own server process (the reconciler's status checks ran in processes of their own).
    messages = [m for m in everything_seen if m["pid"] == call["pid"]]
    # On stdio both revisions cancel with notifications/cancelled naming the request.
    assert item.detail["mcp"]["revision"] == GIT_REVISIONS[asked]
    assert item.detail["mcp"]["cancel_wire"] == "notifications/cancelled"
    [cancelled] = [m for m in messages if m["msg"].get("method") == "notifications/cancelled"]
    assert cancelled["msg"]["params"]["requestId"] == call["msg"]["id"]
    answers = [m for m in messages if m["dir"] == "out" and m["msg"].get("id") == call["msg"]["id"]]
    assert answers == []  # the server never answers a cancelled call, though its commit landed
    summary = task_summary(fresh(task))
    assert "review required" not in summary
    evidence_report(
        f"stdio git_commit cancelled mid-flight ({item.detail['mcp']['revision']}), settled by git_log",
        item,
        {
            "tools/call": call["msg"],
            "notifications/cancelled": cancelled["msg"],
            "answers to the cancelled call": [a["msg"] for a in answers],
            "status check": item.evidence["detail"]["status_check"],
        },
        summary,
    )


def _sweep_settles(item: WorkItem) -> bool:
    try:
        sweep_once(now=timezone.now(), concurrency=1)
        return state_of(item) == S.COMPLETED
    finally:
        connection.close()


def test_server_that_crashes_mid_call_leaves_the_item_uncertain_with_the_error(
    mcp_settings, git_server, git_repo, clock
):
    mcp_settings(servers={"git": git_server["config"]}, deadline_s=4.0, recheck_interval_s=2.0)
    crashing_pre_commit(git_repo)
    message = f"agent commit {time.time_ns()}"
    task = make_task()
    item = tool_item(task, "commit")
    results: list[Any] = []
    errors: list[Exception] = []
    thread = run_agent_in_thread(item, {"repo_path": str(git_repo), "message": message}, results, errors, 0.0)
    thread.join(30)

    assert results == [] and len(errors) == 1  # the agent hears about the crash
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["stage"] == "the call" and item.evidence["error"]
    assert "no answer came" in item.evidence["uncertain_because"]
    assert "status check (git_log) will look" in item.evidence["uncertain_because"]
    # The reconciler looks with git_log until its deadline: the commit never landed.
    clock.now = timezone.now()
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN and message not in git_log(git_repo)
    assert "did not show" in item.evidence["last_look"]["message"]
    assert "still did not show the effect at the mechanism's deadline" in item.evidence["uncertain_because"]
    messages = read_wire(git_server["wire"])
    exits = [m for m in messages if m["dir"] == "exit"]
    assert exits and exits[0]["msg"]["returncode"] != 0
    evidence_report(
        "server crashed mid-call",
        item,
        {"server exit": exits[0]["msg"], "error": item.evidence["error"], "last look": item.evidence["last_look"]},
        task_summary(fresh(task)),
    )


def test_a_stdio_server_that_cannot_start_leaves_the_item_failed_with_the_error(mcp_settings, tmp_path: Path):
    mcp_settings(servers={"broken": {"command": str(tmp_path / "no-such-server")}})
    task = make_task()
    item = tool_item(task, "commit")
    with pytest.raises(OSError):
        anyio.run(lambda: mcp_call_tool(item_id=item.pk, server="broken", tool="git_commit", actor="agent"))
    item.refresh_from_db()
    assert item.state == S.FAILED and item.outcome.startswith("not sent:")
    assert item.evidence["stage"] == "before the call"


def test_stdio_parameters_given_in_code_are_recorded_by_name_not_as_an_object(mcp_settings, git_repo):
    """The original failure: StdioServerParameters could not be recorded and left the item queued."""
    from mcp import StdioServerParameters

    from tests.reference_servers import GIT_SERVER

    task = make_task()
    item = tool_item(task, "log")
    params = StdioServerParameters(command=str(GIT_SERVER), env={"GIT_SECRET_FOR_TEST": "x-secret"})
    result = anyio.run(
        lambda: mcp_call_tool(
            item_id=item.pk, server=params, tool="git_log", arguments={"repo_path": str(git_repo)}, actor="agent"
        )
    )
    assert result is not None and "Message: first" in " ".join(getattr(c, "text", "") for c in result.content)
    item.refresh_from_db()
    assert item.state == S.COMPLETED
    assert item.detail["mcp"]["transport"] == "stdio" and item.detail["mcp"]["command"] == "mcp-server-git"
    assert "x-secret" not in json.dumps(item.detail)
