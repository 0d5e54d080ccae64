"""Each framework example in docs/examples runs as written, in its own process, against a live
server and the sandbox's scripted model: once to the end, and once stopped while a tool works. The
CrewAI one runs in the CrewAI venv (`make crewai-venv`): crewai cannot be installed beside the server."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reconcile.mechanisms.openai.sandbox_model import claude_cli_env
from stopdesk.client import Client
from stopdesk.services.runtimes import runtime_create
from tests.frameworks_venvs import CREWAI_PYTHON

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    "openai_agents_agent.py",
    "pydantic_ai_agent.py",
    "langgraph_agent.py",
    pytest.param("crewai_agent.py", marks=pytest.mark.crewai),
]
# The Python each example runs with: the CrewAI one has a venv of its own.
PYTHON = {"crewai_agent.py": str(CREWAI_PYTHON)}
# CrewAI ends between steps: after the report is stopped, it still asks the model once more, and
# that request, refused, is recorded as a discarded draft.
STOPPED_SUMMARY = {
    "crewai_agent.py": "Stopped new work. One draft discarded. One agent run stopped before it finished. "
    "One report stopped before it finished. Two drafts completed. Two lookups completed."
}
CLAUDE_EXAMPLE = "claude_agent_sdk_agent.py"  # its own script: a file edit and a command


def _run(example: str, url: str, token: str, model_url: str, step_seconds: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "STOPDESK_URL": url,
        "STOPDESK_TOKEN": token,
        "OPENAI_BASE_URL": model_url,
        "STEP_SECONDS": step_seconds,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("MODEL", None)
    if example == CLAUDE_EXAMPLE:
        # The Claude Code CLI, pointed at the scripted model's Messages endpoint and nothing else.
        home = tempfile.mkdtemp(prefix="claude-home-")
        env.update(claude_cli_env(model_url.removesuffix("/v1"), home), WORKDIR=tempfile.mkdtemp(prefix="claude-work-"))
    return subprocess.Popen(
        [PYTHON.get(example, sys.executable), str(ROOT / "docs" / "examples" / example)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_runs_to_the_end(example, live_server, model):
    _party, model_url = model
    token = runtime_create(name="example-agent", actor="test")[1]
    agent = _run(example, live_server.url, token, model_url, "0.02")
    out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[-2] == "Acme has 12 employees; the report is ready."
    assert (
        lines[-1]
        == "Finished. One agent run completed. Three drafts completed. Two lookups completed. One report completed."
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_stops_when_stop_is_pressed(example, live_server, model):
    _party, model_url = model
    token = runtime_create(name="example-agent", actor="test")[1]
    agent = _run(example, live_server.url, token, model_url, "1.0")
    assert agent.stdout is not None
    task_id = int(agent.stdout.readline().split()[1].rstrip(":"))
    with Client(live_server.url, token) as operator:
        deadline = time.monotonic() + 60
        while not any(i.noun == "report" and i.state == "running" for i in operator.get_task(task_id).items):
            assert time.monotonic() < deadline, "the agent never started its report"
            time.sleep(0.05)
        operator.request_stop(task_id, reason="operator pressed Stop")
    out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[-2] == "stopped: the run ended and no tool ran after Stop"
    assert lines[-1] == STOPPED_SUMMARY.get(
        example,
        "Stopped new work. One agent run stopped before it finished. One report stopped before it finished. "
        "Two drafts completed. Two lookups completed.",
    )


def test_the_claude_agent_sdk_example_runs_to_the_end(live_server, model):
    _party, model_url = model
    token = runtime_create(name="example-agent", actor="test")[1]
    agent = _run(CLAUDE_EXAMPLE, live_server.url, token, model_url, "0.1")
    out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[-2] == "The notes are written and checked."
    assert lines[-1] == "Finished. One command ran. One file edited. One agent run completed."


def test_the_claude_agent_sdk_example_stops_when_stop_is_pressed(live_server, model):
    _party, model_url = model
    token = runtime_create(name="example-agent", actor="test")[1]
    agent = _run(CLAUDE_EXAMPLE, live_server.url, token, model_url, "20")
    assert agent.stdout is not None
    task_id = int(agent.stdout.readline().split()[1].rstrip(":"))
    with Client(live_server.url, token) as operator:
        deadline = time.monotonic() + 60
        while not any(i.noun == "command" and i.state == "running" for i in operator.get_task(task_id).items):
            assert time.monotonic() < deadline, "the agent never began its command"
            time.sleep(0.05)
        time.sleep(0.5)  # the command itself starts just after it passed the boundary
        operator.request_stop(task_id, reason="operator pressed Stop")
    began = time.monotonic()
    out, err = agent.communicate(timeout=60)
    assert time.monotonic() - began < 30, "the 60 s command was not stopped"
    assert agent.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[-2] == "stopped: the session was interrupted and no tool ran after Stop"
    assert lines[-1] == (
        "Stopped new work. One agent run stopped before it finished. One command stopped before it finished. "
        "One file edited."
    )


def test_the_readme_shows_the_openai_agents_example_as_it_is():
    import re

    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- readme-example: openai_agents_agent.py -->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its framework example"
    assert match.group(1) == (ROOT / "docs" / "examples" / "openai_agents_agent.py").read_text()
