"""`make run`'s entry point, `manage.py up`, as a new user would start it: a real subprocess on a free
port with an empty data folder. It must serve the login page, run a demo task, and on Ctrl-C stop
everything within a bound, leaving no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from reconcile.mechanisms.mcp.sandbox import READ_VALUE
from stopdrill.launcher import free_port
from tests.run.helpers import PYTHON, ROOT, clean_env, processes_with

pytestmark = pytest.mark.slow

START_WITHIN_S = 90
STOP_WITHIN_S = 20


class Up:
    def __init__(self, data_dir: Path, port: int, *, by_flag: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.data_dir, self.port = data_dir, port
        self.marker = f"STOPDESK_DATA_DIR={data_dir}"
        self.lines: list[str] = []
        args = ["manage.py", "up", "--port", str(port), "--sandbox-port", "0", "--pace", "5", *extra]
        env = clean_env(data_dir)
        if by_flag:
            args += ["--data-dir", str(data_dir)]
            env["STOPDESK_DATA_DIR"] = str(data_dir.parent / "elsewhere")
        self.proc = subprocess.Popen(
            [PYTHON, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def query(self, sql: str) -> list[tuple]:
        with sqlite3.connect(self.data_dir / "stopdesk.sqlite3", timeout=10) as db:
            return db.execute(sql).fetchall()

    def kill_everything(self) -> None:
        """Cleanup after a failed assertion: nothing may outlive the test."""
        for pid, _ in processes_with(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def up(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    started = Up(tmp_path / "data", free_port(), by_flag=getattr(request, "param", False))
    yield started
    started.kill_everything()


def test_up_serves_the_login_page_runs_the_demo_task_and_stops_cleanly(up: Up) -> None:
    assert up.wait_for("Press Ctrl-C to stop everything.", START_WITHIN_S), up.output
    base = f"http://127.0.0.1:{up.port}"
    assert f"Open       {base}/" in up.output
    assert "Sign in    admin / " in up.output

    login = httpx.get(f"{base}/login/", timeout=10)
    assert login.status_code == 200
    assert 'name="password"' in login.text
    health = httpx.get(f"{base}/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert httpx.get(f"{base}/static/stopdesk/app.css", timeout=10).status_code == 200
    watch_url = _watch_url(up.output)
    _the_web_door_sends_watches_to_the_watch_server(base, watch_url)

    # The demo task exists and its agent is really running in the worker.
    assert up.query("SELECT title FROM stopdesk_task") == [("Invoice analysis: ACME batch 42",)]
    # Each draft is registered queued, then submitted (running): waited for, on a busy machine too.
    deadline = time.monotonic() + 30
    states: list[tuple] = []
    while time.monotonic() < deadline:
        states = up.query("SELECT noun, state FROM stopdesk_workitem ORDER BY id")
        drafts = [s for s in states if s[0] == "draft"]
        if ("agent run", "running") in states and drafts == [("draft", "running"), ("draft", "running")]:
            break
        time.sleep(0.3)
    assert ("agent run", "running") in states, states
    assert [s for s in states if s[0] == "draft"] == [("draft", "running"), ("draft", "running")], states
    _the_openai_stand_ins_webhooks_reach_the_web_door(up)
    assert processes_with(up.marker), "the web server and the worker run with the data folder in their environment"
    gateway_url = _the_gateway_records_a_call_to_the_sandbox_mcp_server(up)

    # A second demo from another terminal prints where to open it, as a full address.
    demo = subprocess.run(
        [PYTHON, "manage.py", "demo_task", "--pace", "5"],
        cwd=ROOT,
        env=clean_env(up.data_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert demo.returncode == 0, demo.stderr
    assert f"started: {base}/tasks/" in demo.stdout, demo.stdout

    up.proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
    started = time.monotonic()
    assert up.proc.wait(STOP_WITHIN_S) == 0
    took = time.monotonic() - started
    up.reader.join(5)
    assert "Stopped." in up.output
    assert processes_with(up.marker) == [], f"left behind after {took:.1f}s"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{watch_url}/healthz", timeout=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(gateway_url, timeout=2)


def _the_openai_stand_ins_webhooks_reach_the_web_door(up: Up) -> None:
    """A draft the stand-in finishes now is announced by its signed webhook, which the web door
    verifies with the secret `up` gave it and keeps; the read-back then records the draft."""
    found = re.search(r"OpenAI\s+(http://\S+?)/v1", up.output)
    assert found, up.output
    (handle,) = up.query("SELECT handle FROM stopdesk_workitem WHERE noun = 'draft' ORDER BY id LIMIT 1")[0]
    assert re.fullmatch(r"resp_[0-9a-f]+", handle)
    httpx.post(f"{found[1]}/_control/responses/{handle}/finish", json={"status": "completed"}, timeout=10)
    deadline, rows, draft = time.monotonic() + 30, [], []
    while time.monotonic() < deadline:
        rows = up.query(f"SELECT event_type FROM reconcile_providerwebhook WHERE handle = '{handle}'")
        draft = up.query(f"SELECT state FROM stopdesk_workitem WHERE handle = '{handle}'")
        if rows and draft == [("completed",)]:
            break
        time.sleep(0.3)
    assert ("response.completed",) in rows and draft == [("completed",)], (rows, draft)


def _the_gateway_records_a_call_to_the_sandbox_mcp_server(up: Up) -> str:
    """The banner names the MCP Stop gateway's endpoint for the sandbox; a call through it is an item."""
    found = re.search(r"^  Gateway    (http://\S+/mcp/sandbox)  ", up.output, re.MULTILINE)
    assert found is not None, up.output

    async def call() -> bool:
        async with Client(found[1]) as client:
            return (await client.call_tool(READ_VALUE, {"key": "k"})).is_error

    assert anyio.run(call) is False
    # A read's answer reaches the client just before the gateway records it.
    deadline, items = time.monotonic() + 10, []
    while time.monotonic() < deadline:
        items = up.query(
            "SELECT w.noun, w.state FROM stopdesk_workitem w JOIN stopdesk_task t ON t.id = w.task_id "
            "WHERE t.title LIKE 'MCP: % via sandbox'"
        )
        if items != [("sandbox: read_value", "running")]:
            break
        time.sleep(0.1)
    assert items == [("sandbox: read_value", "completed")]
    return found[1]


def _watch_url(output: str) -> str:
    found = re.search(r"^  Watch      (http://\S+)  ", output, re.MULTILINE)
    assert found is not None, output
    return found[1]


def _the_web_door_sends_watches_to_the_watch_server(base: str, watch_url: str) -> None:
    """The watch path answers at once with the watch server's address, which serves watches."""
    started = time.monotonic()
    sent = httpx.get(f"{base}/api/v1/tasks/1/stop/watch", params={"timeout": 20}, timeout=10)
    assert time.monotonic() - started < 5
    assert sent.status_code == 307 and sent.json()["watch_url"] == watch_url
    assert sent.headers["location"] == f"{watch_url}/api/v1/tasks/1/stop/watch?timeout=20"
    assert httpx.get(f"{watch_url}/healthz", timeout=10).status_code == 200
    # Without a token the watch server refuses: it is the watch endpoint itself, not a page.
    assert httpx.get(sent.headers["location"], timeout=10).status_code == 401


@pytest.mark.parametrize("up", [True], indirect=True, ids=["data-dir-flag"])
def test_up_takes_its_data_folder_from_the_flag_and_stops_cleanly_on_sigterm(up: Up) -> None:
    assert up.wait_for("Press Ctrl-C to stop everything.", START_WITHIN_S), up.output
    assert (up.data_dir / "stopdesk.sqlite3").exists()
    assert not (up.data_dir.parent / "elsewhere" / "stopdesk.sqlite3").exists()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(STOP_WITHIN_S) == 0
    assert processes_with(up.marker) == []


def test_ctrl_c_with_nothing_running_does_not_say_a_task_was_running(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", free_port(), extra=("--no-demo",))
    try:
        assert up.wait_for("Press Ctrl-C to stop everything.", START_WITHIN_S), up.output
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(STOP_WITHIN_S) == 0
        up.reader.join(5)
        assert "Stopped." in up.output
        assert up.query("SELECT count(*) FROM stopdesk_workitem") == [(0,)]
        assert "still running" not in up.output, up.output
    finally:
        up.kill_everything()
