"""CrewAI (`stopdesk.agent.frameworks.crewai`): a real crew in its own process and venv (crewai cannot
be installed beside the server), recording over HTTP into a live server on PostgreSQL, its model
the sandbox's scripted one. The operator presses Stop through the API, as the task page does."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn
from stopdesk.client import Client
from stopdesk.models import Task, WorkItem
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary
from tests.frameworks_venvs import CREWAI_PYTHON

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.crewai, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "stopdrill" / "crewai_child.py"
UNINTERRUPTIBLE = "cannot be interrupted; waiting for it to finish"


class Crew:
    """The crew's process: its config, its events (one JSON line each), its end."""

    def __init__(self, live_server: Any, model_url: str, model: str, **config: Any) -> None:
        token = runtime_create(name="crewai-agent", actor="test")[1]
        self.operator = Client(live_server.url, token)
        self.task_id = self.operator.create_task("Research Acme (CrewAI)").id
        config = {
            "stopdesk_url": live_server.url,
            "token": token,
            "task_id": self.task_id,
            "model_url": model_url,
            "model": model,
            **config,
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DJANGO_"))}
        self.process = subprocess.Popen(
            [str(CREWAI_PYTHON), str(CHILD), json.dumps(config)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def wait_for(self, event: str, timeout: float = 60, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {event} {match} from the crew; saw {self.seen}"
            try:
                got = self.events.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(got)
            if got["event"] == event and all(got.get(k) == v for k, v in match.items()):
                return got

    def end(self, timeout: float = 60) -> dict[str, Any]:
        try:
            ended = self.wait_for("end", timeout)
            self.process.wait(timeout)
            self.reader.join(5)
            while not self.events.empty():
                self.seen.append(self.events.get())
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.operator.close()
        # CrewAI never reached past loopback (its telemetry, tracing and version check are off).
        assert not [e for e in self.seen if e["event"] == "network_refused"]
        err = self.process.stderr.read()[-3000:] if self.process.stderr else ""
        assert (self.process.returncode, ended["outcome"]) != (1, "failed"), f"{ended}\n{err}"
        assert self.process.returncode == 0, err
        return ended

    def stop(self) -> None:
        self.operator.request_stop(self.task_id, reason="operator pressed Stop")

    def items(self) -> list[WorkItem]:
        return list(WorkItem.objects.filter(task_id=self.task_id).order_by("id"))

    def tools(self) -> list[WorkItem]:
        return [i for i in self.items() if i.kind != "model_request" and i.noun != "agent run"]

    def summary(self) -> str:
        return task_summary(Task.objects.get(pk=self.task_id))


def until(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_crew_runs_to_the_end_with_every_call_recorded(live_server, model):
    party, url = model
    name = party.load_script(
        Script.build("crew-lookup", [Turn(tool_calls=(ToolCall("look_up", {"company": "Acme"}),)), Turn(text="done")])
    )
    crew = Crew(live_server, url, name, tools=["look_up"])

    assert crew.end() == {"event": "end", "outcome": "completed", "output": "done"}
    (tool,) = crew.tools()
    assert (tool.label, tool.state, tool.handle, tool.noun) == ("look_up", S.COMPLETED, "call_0_0", "lookup")
    assert tool.outcome == "Acme: 12 employees, based in Lyon"
    assert crew.summary() == (
        "Every item so far has finished; the task is still open. "
        "One agent run completed. Two drafts completed. One lookup completed."
    )


def test_a_crew_stopped_mid_tool_records_the_sync_tool_running_on_then_as_it_ended(live_server, model):
    party, url = model
    name = party.load_script(
        Script.build("crew-export", [Turn(tool_calls=(ToolCall("blocking_export", {"name": "Acme"}),)), Turn(text="x")])
    )
    crew = Crew(live_server, url, name, tools=["blocking_export"], block_s=2.0)
    crew.wait_for("tool_started", tool="blocking_export")
    crew.stop()

    # While the plain function runs on after Stop: still running, and the ledger says why.
    until(lambda: "uninterruptible" in crew.tools()[0].evidence)
    (tool,) = crew.tools()
    # (read while the function still runs: it has not said it returned)
    assert not any(e["event"] == "tool_returned" for e in [*crew.seen, *list(crew.events.queue)])
    assert (tool.state, tool.evidence) == (S.RUNNING, {"uninterruptible": UNINTERRUPTIBLE})
    running = crew.summary()
    assert "One export still running: it cannot be interrupted; waiting for it to finish." in running
    assert "export stopped" not in running

    assert crew.end()["outcome"] == "stopped"
    # Then what it really did; the run's own item after it; never "stopped".
    (tool,) = crew.tools()
    assert (tool.state, tool.outcome) == (S.COMPLETED, "exported Acme")
    assert tool.finished_at >= tool.cancel_requested_at
    (run,) = [i for i in crew.items() if i.noun == "agent run"]
    assert run.state == S.CANCELLED and run.finished_at >= tool.finished_at
    # The crew asked the model once more (the tool's answer said the task was stopped): refused.
    assert crew.summary() == (
        "Stopped new work. One draft discarded. One agent run stopped before it finished. "
        "One draft completed. One export completed."
    )
    assert len(party.model_log()) == 1  # the crew never took another step


def test_a_sync_tool_that_checks_stop_requested_in_crewais_thread_ends_stopped(live_server, model):
    party, url = model
    name = party.load_script(
        Script.build("crew-careful", [Turn(tool_calls=(ToolCall("careful_export", {"name": "Acme"}),)), Turn(text="x")])
    )
    crew = Crew(live_server, url, name, tools=["careful_export"], block_s=30.0)
    crew.wait_for("tool_started", tool="careful_export")
    began = time.monotonic()
    crew.stop()

    # It heard Stop inside its thread (stopdesk.stop_requested) and stopped, long before its 30 s.
    returned = crew.wait_for("tool_returned", tool="careful_export")
    assert time.monotonic() - began < 15
    assert crew.end()["outcome"] == "stopped"
    (tool,) = crew.tools()
    assert (tool.state, tool.outcome) == (S.CANCELLED, f"careful_export: stopped after {returned['pages']} pages")
    assert "One export stopped before it finished." in crew.summary()


def test_an_async_tool_stopped_mid_call_is_cancelled(live_server, model):
    party, url = model
    name = party.load_script(
        Script.build("crew-report", [Turn(tool_calls=(ToolCall("write_report", {"company": "Acme"}),)), Turn(text="x")])
    )
    crew = Crew(live_server, url, name, tools=["write_report"], block_s=30.0)
    crew.wait_for("tool_started", tool="write_report")
    began = time.monotonic()
    crew.stop()

    assert crew.end()["outcome"] == "stopped"
    assert time.monotonic() - began < 15  # interrupted, not waited out
    assert not any(e["event"] == "tool_returned" for e in crew.seen)
    (tool,) = crew.tools()
    assert (tool.state, tool.outcome) == (S.CANCELLED, "write_report: interrupted by Stop")
    assert "One report stopped before it finished." in crew.summary()


def test_a_tool_the_model_asks_for_after_stop_is_refused_and_never_runs(live_server, model):
    party, url = model
    name = party.load_script(
        Script.build(
            "crew-refused",
            [Turn(tool_calls=(ToolCall("look_up", {"company": "Acme"}),), delay_s=1.0), Turn(text="done")],
        )
    )
    # The push never arrives (watch=never): only the boundary stands between Stop and the tool.
    crew = Crew(live_server, url, name, tools=["look_up"], watch="never")
    until(lambda: party.model_log() and any(i.kind == "model_request" and i.state == S.RUNNING for i in crew.items()))
    crew.stop()

    assert crew.end()["outcome"] == "stopped"
    assert not any(e["event"] == "tool_started" for e in crew.seen)
    (tool,) = crew.tools()
    assert (tool.label, tool.state, tool.handle) == ("look_up", S.CANCELLED, "call_0_0")
    assert len(party.model_log()) == 1  # the model never got a second turn


def test_a_crew_stopped_mid_model_request_discards_the_answer_and_asks_nothing_more(live_server, model):
    party, url = model
    name = party.load_script(Script.build("crew-thinking", [Turn(text="part done", delay_s=1.0)]))
    crew = Crew(live_server, url, name, tools=[], tasks=2)
    until(lambda: party.model_log() and any(i.kind == "model_request" and i.state == S.RUNNING for i in crew.items()))
    crew.stop()  # while the first task's answer is on its way

    assert crew.end()["outcome"] == "stopped"
    assert len(party.model_log()) == 1  # the second task never asked the model
    assert crew.summary() == "Stopped new work. One draft discarded. One agent run stopped before it finished."


def test_a_crew_stopped_between_tasks_never_begins_the_next(live_server, model):
    party, url = model
    name = party.load_script(Script.build("crew-two-tasks", [Turn(text="part done")]))
    crew = Crew(live_server, url, name, tools=[], tasks=2, task_pause_s=1.0)
    crew.wait_for("task_finished")
    crew.stop()  # the first task is done, the second not begun

    assert crew.end()["outcome"] == "stopped"
    assert len(party.model_log()) == 1  # the second task never asked the model
    assert not any(e["event"] == "task_finished" for e in crew.seen[1:])
    assert crew.summary() == "Stopped new work. One agent run stopped before it finished. One draft completed."


def test_a_call_crewai_refuses_is_recorded_as_asked_for_and_never_ran(live_server, model):
    """A tool call is recorded as the model's answer asks for it (before CrewAI runs it). CrewAI
    refuses a call past the tool's usage limit without running the tool: that call is in the
    ledger as asked for, and never ran; never "stopped"."""
    party, url = model
    name = party.load_script(
        Script.build(
            "crew-limited",
            [
                Turn(tool_calls=(ToolCall("look_up", {"company": "Acme"}),)),
                Turn(tool_calls=(ToolCall("look_up", {"company": "Globex"}),)),
                Turn(text="done"),
            ],
        )
    )
    crew = Crew(live_server, url, name, tools=["look_up"], max_uses={"look_up": 1})

    assert crew.end()["outcome"] == "completed"
    assert [e["tool"] for e in crew.seen if e["event"] == "tool_started"] == ["look_up"]  # once
    assert [(t.handle, t.state, t.outcome, t.evidence) for t in crew.tools()] == [
        ("call_0_0", S.COMPLETED, "Acme: 12 employees, based in Lyon", {}),
        ("call_1_0", S.CANCELLED, "look_up: asked for, never ran", {"never_ran": True}),
    ]
    summary = crew.summary()
    assert "One lookup completed." in summary and "One lookup never ran." in summary
    assert "stopped" not in summary.lower()


def test_a_call_whose_arguments_crewai_coerces_is_one_record_under_the_models_id(live_server, model):
    """The model asks for `work` with its step as text; CrewAI validates it to a number before the
    tool sees it. The call registered as asked for is the one that ran: one record, the model's id."""
    party, url = model
    name = party.load_script(
        Script.build("crew-coerced", [Turn(tool_calls=(ToolCall("work", {"step": "3"}),)), Turn(text="done")])
    )
    crew = Crew(live_server, url, name, tools=["work"])

    assert crew.end()["outcome"] == "completed"
    assert [(t.label, t.handle, t.state, t.outcome) for t in crew.tools()] == [
        ("work", "call_0_0", S.COMPLETED, "step 3 done"),
    ]
    assert "never ran" not in crew.summary()
