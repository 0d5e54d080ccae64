"""The gateway driven by the MCP Inspector's CLI (`@modelcontextprotocol/inspector`, pinned in
`tests/reference_servers/package.json`), a client no one here wrote, run headless as a
subprocess the way a shell script or a CI job runs it: one process per request (connect, the one
method, disconnect). Asked for nothing (`--protocol-era legacy`, its default for a URL) it speaks
2025-11-25 with its handshake and session; asked for `auto` it negotiates 2026-07-28.

Headless and at home: the launcher is run by `node` from the installed package (never `npx`,
which would ask the registry), with `--stored-auth-only` (it never starts an OAuth login, the
only path that opens a browser) and `MCP_AUTO_OPEN_ENABLED=false` besides, no display, no proxy
variables, and its catalog and storage in the test's own directory instead of the home
directory. It declares Node >= 22.19 (npm warns on older Node); what these tests use of it runs
on Node 20 as well. Each test checks what the Inspector
printed, what the upstream received and how the item ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from reconcile.mechanisms.mcp import sandbox as tools
from stopdesk.gateway.server import arguments_hash
from stopdesk.models import Task, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from tests.factories import make_task
from tests.reconcile.helpers import sweep_until_settled
from tests.reference_servers import INSPECTOR_CLI

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.reference_servers]

# The Inspector's protocol era, and the revision it ends up speaking to the gateway.
ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}
CLIENT = "inspector-cli 2.12.0"  # how it names itself (clientInfo): the task's title says it
ALL = {tools.SLOW_LOOKUP, tools.SLOW_WRITE, tools.READ_VALUE, tools.EXPORT_REPORT}


@pytest.fixture(params=sorted(ERAS))
def era(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """The Inspector's environment: its files under the test's directory, nothing that could
    take it off loopback or to a browser."""
    away = {"DISPLAY", "WAYLAND_DISPLAY", "BROWSER"}
    env = {k: v for k, v in os.environ.items() if k not in away and not k.lower().endswith("_proxy")}
    return {
        **env,
        "HOME": str(tmp_path),
        "MCP_STORAGE_DIR": str(tmp_path / "storage"),
        "MCP_CATALOG_PATH": str(tmp_path / "mcp.json"),
        "MCP_CLIENT_CONFIG_PATH": str(tmp_path / "client.json"),
        "MCP_INSPECTOR_OAUTH_STATE_PATH": str(tmp_path / "oauth.json"),
        "MCP_AUTO_OPEN_ENABLED": "false",
        "NO_PROXY": "*",
        "NO_COLOR": "1",
    }


def command(url: str, era: str, method: str, *more: str, task_id: int | None = None) -> list[str]:
    argv = ["node", str(INSPECTOR_CLI), "--cli", url, "--transport", "http", "--protocol-era", era]
    argv += ["--method", method, *more, "--format", "json", "--stored-auth-only", "--connect-timeout", "10000"]
    if task_id is not None:
        argv += ["--header", f"X-Stopdesk-Task: {task_id}"]
    return argv


def inspector(home: dict[str, str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    """Run the Inspector to its end: its exit code, and what it printed (`{"result": ...}` on
    stdout, or `{"error": {"code", "message"}}` on stderr)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=home, timeout=60, check=False)
    printed = done.stdout if done.returncode == 0 else done.stderr
    try:
        return done.returncode, json.loads(printed)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {done.returncode}; stdout {done.stdout!r}; stderr {done.stderr!r}") from None


def write(key: str, seconds: float) -> list[str]:
    """slow_write's arguments as the Inspector takes them (it types them by the tool's schema)."""
    return ["--tool-name", tools.SLOW_WRITE, "--tool-arg", f"key={key}", "value=v", f"seconds={seconds}"]


def stop(task_id: int) -> None:
    task_request_stop(task_id=task_id, actor="user:operator", reason="enough", dispatch=lambda ids: None)


def settled(item_id: int, seconds: float = 15) -> WorkItem:
    deadline = time.monotonic() + seconds
    while (item := WorkItem.objects.get(pk=item_id)).state in (S.QUEUED, S.RUNNING):
        assert time.monotonic() < deadline, f"item {item_id} still {item.state}"
        time.sleep(0.05)
    return item


def test_tools_list_through_the_gateway_is_the_upstreams_narrowed_by_enforce(gateway, settings, home, era):
    code, printed = inspector(home, command(gateway.url, era, "tools/list"))
    assert code == 0 and {t["name"] for t in printed["result"]["tools"]} == ALL
    settings.STOPDESK_READINESS_POLICY = "enforce"
    code, printed = inspector(home, command(gateway.url, era, "tools/list"))
    # export_report (no status check, no drill) cannot be accounted for after a Stop: not shown.
    assert code == 0 and {t["name"] for t in printed["result"]["tools"]} == ALL - {tools.EXPORT_REPORT}
    # The Inspector looks the tool up in that listing before calling it, so it refuses the call
    # itself: nothing reaches the gateway's call path or the upstream.
    code, printed = inspector(
        home, command(gateway.url, era, "tools/call", "--tool-name", tools.EXPORT_REPORT, "--tool-arg", "seconds=0.05")
    )
    assert code == 5 and printed["error"]["code"] == "tool_not_found"
    assert not WorkItem.objects.exists() and gateway.party.wire("tools/call") == []


def test_an_inspector_call_is_answered_and_recorded_as_an_item_of_its_task(gateway, home, era):
    code, printed = inspector(home, command(gateway.url, era, "tools/call", *write("k1", 0.05)))
    assert code == 0 and printed["result"]["isError"] is False
    assert printed["result"]["content"] == [{"type": "text", "text": "wrote k1='v'"}]
    item = WorkItem.objects.get()
    assert item.state == S.COMPLETED and item.task.title == f"MCP: {CLIENT} via sandbox"
    facts = item.detail["gateway"]
    assert (facts["upstream"], facts["tool"]) == ("sandbox", tools.SLOW_WRITE)
    # The Inspector typed "seconds=0.05" as the number the schema asks for: the hash says so.
    assert facts["arguments_sha256"] == arguments_hash({"key": "k1", "value": "v", "seconds": 0.05})
    assert facts["client_revision"] == ERAS[era]  # the revision the Inspector spoke to the gateway
    [upstream_call] = gateway.party.wire("tools/call")
    assert facts["upstream_request_id"] == upstream_call["id"]
    assert [e["call"] for e in gateway.party.effects(tools.SLOW_WRITE)] == ["k1"]


def test_an_inspector_call_after_its_tasks_stop_is_refused_and_never_reaches_the_upstream(gateway, home, era):
    task = make_task()
    stop(task.pk)
    code, printed = inspector(home, command(gateway.url, era, "tools/call", *write("k2", 0.05), task_id=task.pk))
    # The Inspector prints the gateway's MCP error message (its envelope's code is its own).
    assert code == 1 and printed["error"]["message"] == "stopped by user:operator: enough"
    assert gateway.party.wire("tools/call") == [] and gateway.party.journal(tools.SLOW_WRITE) == []
    item = WorkItem.objects.get(task=task)
    assert item.state == S.CANCELLED and item.detail["gateway"]["client_revision"] == ERAS[era]


def test_stop_during_an_inspectors_long_call_answers_it_at_once(gateway, home, era):
    task = make_task()

    def press() -> None:
        try:
            deadline = time.monotonic() + 30
            while not gateway.party.journal(tools.SLOW_LOOKUP) and time.monotonic() < deadline:
                time.sleep(0.02)
            stop(task.pk)
        finally:
            connection.close()

    presser = threading.Thread(target=press)
    presser.start()
    began = time.monotonic()
    lookup = ["--tool-name", tools.SLOW_LOOKUP, "--tool-arg", "query=q", "seconds=20"]
    code, printed = inspector(home, command(gateway.url, era, "tools/call", *lookup, task_id=task.pk))
    presser.join()
    assert time.monotonic() - began < 15  # told at Stop (pushed), not after the lookup's 20 s
    assert code == 1 and printed["error"]["message"] == "stopped by user:operator: enough"
    assert "interrupted" in [e["event"] for e in gateway.party.journal(tools.SLOW_LOOKUP)]
    assert WorkItem.objects.get(task=task).state == S.CANCELLED  # read-only: nothing to account for


def test_the_inspectors_next_run_on_2026_07_28_lands_on_its_stopped_task_and_is_refused(gateway, home):
    """No session in 2026-07-28: the same client (name, version, upstream) keeps its task from
    one Inspector process to the next, so a Stop pressed between two runs refuses the second."""
    code, _ = inspector(
        home, command(gateway.url, "auto", "tools/call", "--tool-name", tools.READ_VALUE, "--tool-arg", "key=k")
    )
    assert code == 0
    stop(Task.objects.get().pk)
    code, printed = inspector(home, command(gateway.url, "auto", "tools/call", *write("k3", 0.05)))
    assert code == 1 and printed["error"]["message"] == "stopped by user:operator: enough"
    assert [m["tool"] for m in gateway.party.wire("tools/call")] == [tools.READ_VALUE]
    refused = WorkItem.objects.get(detail__gateway__tool=tools.SLOW_WRITE)
    assert refused.state == S.CANCELLED and refused.task_id == Task.objects.get().pk


def kill_once_started(gateway, home: dict[str, str], era: str, key: str, signum: int) -> int:  # type: ignore[no-untyped-def]
    """Start a 2-second write with the Inspector, send it `signum` once the upstream has started
    the write, and return the Inspector's exit code."""
    process = subprocess.Popen(
        command(gateway.url, era, "tools/call", *write(key, 2)),
        env=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        journal = lambda: gateway.party.journal(tools.SLOW_WRITE)  # noqa: E731
        while not any(e["call"] == key and e["event"] == "started" for e in journal()):
            assert time.monotonic() < deadline and process.poll() is None, process.communicate(timeout=5)
            time.sleep(0.02)
        process.send_signal(signum)
        process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_inspector_interrupted_mid_call_on_2025_11_25_leaves_the_call_running_and_it_completes(
    gateway, home, signum
):
    """The Inspector has no handler for the signal during a call: the process dies without a
    notifications/cancelled, and in 2025-11-25 a dropped connection is not a cancel. The gateway
    lets the upstream finish, and the item says what happened: the write landed."""
    assert kill_once_started(gateway, home, "legacy", "k4", signum) == -signum
    item = settled(WorkItem.objects.get().pk)
    assert item.state == S.COMPLETED and item.outcome == "wrote k4='v'"
    assert item.detail["gateway"]["client_revision"] == "2025-11-25"
    assert [e["call"] for e in gateway.party.effects(tools.SLOW_WRITE)] == ["k4"]
    assert gateway.party.wire("notifications/cancelled") == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_inspector_interrupted_mid_call_on_2026_07_28_leaves_the_write_uncertain(gateway, home, clock, signum):
    """In 2026-07-28 the dropped connection closes the call's stream, which is its cancel: the
    gateway closes the upstream's stream too. The write is not read-only and no answer came, so
    the item is uncertain with a deadline, never cancelled; the status check finds no effect and
    it stays uncertain past the deadline, for a person to decide."""
    assert kill_once_started(gateway, home, "auto", "k5", signum) == -signum
    item = settled(WorkItem.objects.get().pk)
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["cancelled_by"] == "the client"
    assert item.evidence["cancel"]["sent"] == "response stream closed"
    assert item.detail["gateway"]["client_revision"] == "2026-07-28"
    [upstream_call] = gateway.party.wire("tools/call")
    assert upstream_call["stream_closed"] and item.detail["gateway"]["upstream_request_id"] == upstream_call["id"]
    assert "interrupted" in [e["event"] for e in gateway.party.journal(tools.SLOW_WRITE)]
    assert gateway.party.effects(tools.SLOW_WRITE) == []
    sweep_until_settled(clock, item)
    item.refresh_from_db()
    assert item.state == S.UNCERTAIN
    assert item.evidence["last_look"]["detail"]["status_check"]["answer"] == "k5: no value"
    assert "still did not show the effect at the mechanism's deadline" in item.evidence["uncertain_because"]
