"""The README's agent example runs as written, in its own process, against a live server: once to
the end, and once with Stop pressed while it works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stopdesk.client import Client
from stopdesk.services.runtimes import runtime_create

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def _example(tmp_path: Path) -> Path:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- readme-example: agent.py -->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its agent example"
    script = tmp_path / "agent.py"
    script.write_text(match.group(1))
    return script


def _run(script: Path, url: str, token: str, step_seconds: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "STOPDESK_URL": url,
        "STOPDESK_TOKEN": token,
        "STEP_SECONDS": step_seconds,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        cwd=script.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_readme_agent_runs_to_the_end(live_server, tmp_path):
    token = runtime_create(name="readme-agent", actor="test")[1]
    agent = _run(_example(tmp_path), live_server.url, token, "0.03")
    out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert out.strip().splitlines()[-1] == "Finished. One email sent; it cannot be recalled. Five drafts completed."


def test_the_readme_agent_obeys_stop(live_server, tmp_path):
    token = runtime_create(name="readme-agent", actor="test")[1]
    agent = _run(_example(tmp_path), live_server.url, token, "1.5")
    assert agent.stdout is not None
    task_id = int(agent.stdout.readline().split()[1].rstrip(":"))
    with Client(live_server.url, token) as operator:
        deadline = time.monotonic() + 30
        while operator.get_task(task_id).counts.get("running", 0) == 0:  # Stop while the first draft works
            assert time.monotonic() < deadline, "the agent never started a draft"
            time.sleep(0.05)
        operator.request_stop(task_id, reason="operator pressed Stop")
    out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert "stopped between steps" in out and "email: not sent, the task was stopped" in out
    assert (
        out.strip().splitlines()[-1]
        == "Stopped new work. Five drafts discarded. One email cancelled before it started."
    )
