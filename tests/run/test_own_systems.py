"""`manage.py up` uses the systems a user set up themselves and starts sandbox stand-ins only for
the rest; the banner says which is which. `python -m stopdesk web` binds where it is told,
loopback unless told otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from stopdrill.launcher import Launcher, free_port
from tests.run.helpers import PYTHON, ROOT, clean_env, run
from tests.run.test_config_errors import PREFIX, one_line

MINE = {
    "OPENAI_BASE_URL": "http://127.0.0.1:9/my-openai/v1",
    "OPENAI_API_KEY": "sk-my-own-key",
    "STOPDESK_CRM_URL": "http://127.0.0.1:9/my-crm",
}


@pytest.fixture
def launcher(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "STOPDESK_CRM_URL", "STOPDESK_MCP_URL", "STOPDESK_OUTBOX_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in MINE.items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    up = Launcher(host="127.0.0.1", port=free_port(), demo=False, sandbox_base_port=0, out=said.append)
    up.start_sandbox()
    yield up
    assert up.sandbox is not None
    up.sandbox.stop()


def test_up_keeps_the_users_own_systems_and_stands_in_only_for_the_rest(launcher):  # type: ignore[no-untyped-def]
    env = launcher.child_env()
    assert env["OPENAI_BASE_URL"] == MINE["OPENAI_BASE_URL"] and env["OPENAI_API_KEY"] == "sk-my-own-key"
    assert env["STOPDESK_CRM_URL"] == MINE["STOPDESK_CRM_URL"]
    # No stand-in for what the user has; the webhook receiver (not a user's system) always runs.
    assert set(launcher.sandbox.servers) == {"mcp", "outbox", "webhooks"}
    assert httpx.get(env["STOPDESK_OUTBOX_URL"] + "/messages", timeout=5).status_code == 200
    assert env["STOPDESK_MCP_URL"].startswith("http://127.0.0.1:")


def test_the_banner_says_which_systems_are_real_and_which_are_sandbox(launcher):  # type: ignore[no-untyped-def]
    lines = {line.split()[0]: line for line in launcher.systems_lines(launcher.sandbox.urls)}
    assert "my-openai" in lines["OpenAI"] and "real" in lines["OpenAI"] and "OPENAI_BASE_URL" in lines["OpenAI"]
    assert "my-crm" in lines["CRM"] and "real" in lines["CRM"]
    assert "(sandbox)" in lines["MCP"] and "(sandbox)" in lines["Outbox"]


def _listening(port: int) -> set[str]:
    """Local addresses listening on `port`, from /proc/net/tcp (IPv4)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            octets = [str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)]
            found.add(".".join(octets))
    return found


@pytest.mark.parametrize(("bind", "expected"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_web_binds_to_loopback_unless_told_otherwise(tmp_path: Path, bind: str | None, expected: str) -> None:
    port = free_port()
    env = clean_env(tmp_path, PORT=str(port), WEB_CONCURRENCY="1")
    if bind is not None:
        env["STOPDESK_BIND_HOST"] = bind
    proc = subprocess.Popen(
        [PYTHON, "-m", "stopdesk", "web"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _listening(port):
            time.sleep(0.2)
        assert _listening(port) == {expected}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_bind_address_that_is_not_one_is_refused(tmp_path: Path) -> None:
    env = clean_env(tmp_path, STOPDESK_BIND_HOST="every-where please")
    assert one_line(run(["-m", "stopdesk", "check"], env)).startswith(PREFIX + "STOPDESK_BIND_HOST")
