"""The Claude Agent SDK and its Claude Code CLI, for real, against the scripted model's Messages
endpoint on loopback: every tool use recorded with what it touched, subagents as child runs, Stop
in the middle of a command and of a subagent, a tool refused after Stop, and no CLI left behind."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions, UserMessage
from claude_agent_sdk.types import ToolResultBlock

from reconcile.mechanisms.openai.sandbox_model import Script, ToolCall, Turn, claude_cli_env
from stopdesk.agent.frameworks.claude_agent_sdk import (
    CommandFacts,
    SessionFailed,
    classify_command,
    run_agent,
    session_processes,
)
from stopdesk.agent.frameworks.core import STOPPED_RESULT, RunStopped
from stopdesk.models import Task, WorkItem
from stopdesk.states import ItemState as S
from stopdesk.summary import task_summary

pytestmark = [pytest.mark.postgres]

TOOLS = ["Bash", "Write", "Edit", "Read", "Agent", "Task"]


def items(task_id: int) -> list[WorkItem]:
    return list(WorkItem.objects.filter(task_id=task_id).order_by("id"))


def by_label(task_id: int) -> dict[str, list[WorkItem]]:
    found: dict[str, list[WorkItem]] = {}
    for item in items(task_id):
        found.setdefault(item.label, []).append(item)
    return found


def ledger(task_id: int) -> str:
    """The ledger as a person reads it (printed into the test's output on failure)."""
    lines = []
    for i in items(task_id):
        parent = f" under #{i.parent_id}" if i.parent_id else ""
        lines.append(f"#{i.pk} {i.noun} [{i.label}]{parent}: {i.state} - {i.outcome}")
    return "\n".join(lines)


def options(tmp_path: Path, url: str) -> ClaudeAgentOptions:
    work = tmp_path / "work"
    home = tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    return ClaudeAgentOptions(
        cwd=str(work),
        allowed_tools=TOOLS,
        setting_sources=[],
        model="claude-sonnet-4-5",
        env=claude_cli_env(url, str(home)),
    )


def stop_when(event: threading.Event, runtime: Any, task_id: int, within_s: float = 30) -> threading.Thread:
    def operator() -> None:
        from django.db import connections

        try:
            if event.wait(within_s):
                runtime.request_stop(task_id, reason="operator pressed Stop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    return thread


def when(condition: Any, event: threading.Event, within_s: float = 30) -> threading.Thread:
    def watch() -> None:
        from django.db import connections

        try:
            deadline = time.monotonic() + within_s
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.05)
            event.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


async def never() -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize(
    ("command", "facts"),
    [
        ("ls -la | grep x 2>&1 | head", CommandFacts("read_only")),
        ("tail -f /dev/null", CommandFacts("read_only")),
        ("echo hi > out.txt; cat out.txt", CommandFacts("local_write", ("/w/out.txt",))),
        ("echo x>>log", CommandFacts("local_write", ("/w/log",))),
        ("sed -i 's/a/b/' f.py", CommandFacts("local_write", ("/w/f.py",))),
        ("rm -rf build /tmp/cache", CommandFacts("local_write", ("/w/build", "/tmp/cache"))),
        ("cat a | tee copy", CommandFacts("local_write", ("/w/copy",))),
        ("python3 -c 'import os; os.remove(\"x\")'", CommandFacts("local_write")),  # a ; inside quotes is no separator
        ("curl -s https://example.org > page.html", CommandFacts("network", ("/w/page.html",))),
        ("git status && git push", CommandFacts("network")),
        ("frobnicate --all", CommandFacts("unknown")),
        ("echo 'unbalanced", CommandFacts("unknown")),
    ],
)
def test_a_command_line_is_read_for_its_effect_and_what_it_writes(command, facts):
    assert classify_command(command, "/w") == facts


def test_a_session_records_each_tool_use_with_what_it_touched(model, runtime, tmp_path):
    party, url = model
    party.load_script(
        Script.build(
            "edits",
            [
                Turn(
                    tool_calls=(
                        ToolCall("Write", {"file_path": str(tmp_path / "work/a.txt"), "content": "alpha\n"}),
                        ToolCall("Write", {"file_path": str(tmp_path / "work/b.txt"), "content": "beta\n"}),
                    )
                ),
                Turn(tool_calls=(ToolCall("Bash", {"command": "cat a.txt b.txt > both.txt", "description": "join"}),)),
                Turn(tool_calls=(ToolCall("Bash", {"command": "ls", "description": "look"}),)),
                Turn(text="Joined them."),
            ],
        )
    )
    task = runtime.create_task("Join the notes")

    result = asyncio.run(
        run_agent(runtime, task.id, "[script:edits] join the notes", options=options(tmp_path, url.removesuffix("/v1")))
    )

    assert result is not None and result.result == "Joined them."
    assert (tmp_path / "work/both.txt").read_text() == "alpha\nbeta\n"
    found = by_label(task.id)
    (the_run,) = [i for i in items(task.id) if i.noun == "agent run"]
    assert the_run.state == S.COMPLETED and the_run.label == "claude-agent-sdk claude-sonnet-4-5"
    writes = found["Write"]
    assert [w.state for w in writes] == [S.COMPLETED, S.COMPLETED]
    assert sorted(w.detail["tool"]["files"]["paths_written"][0] for w in writes) == [
        str(tmp_path / "work/a.txt"),
        str(tmp_path / "work/b.txt"),
    ]
    join, look = found["Bash"]
    assert join.state == S.COMPLETED and look.state == S.COMPLETED
    assert join.detail["tool"]["command"] == {
        "command": "cat a.txt b.txt > both.txt",
        "cwd": str(tmp_path / "work"),
        "effect": "local_write",
        "paths_written": [str(tmp_path / "work/both.txt")],
        "background": False,
    }
    assert look.detail["tool"]["command"]["effect"] == "read_only"
    assert join.handle == "call_1_0" and join.detail["tool"]["framework"] == "claude-agent-sdk"
    assert task_summary(Task.objects.get(pk=task.id)) == (
        "Every item so far has finished; the task is still open. Two commands ran. Two files edited. "
        "One agent run completed."
    )


def test_stop_in_the_middle_of_a_command_and_of_a_subagent(model, runtime, tmp_path, capsys):
    party, url = model
    work = tmp_path / "work"
    party.load_script(
        Script.build(
            "busy",
            [
                Turn(tool_calls=(ToolCall("Write", {"file_path": str(work / "plan.txt"), "content": "plan\n"}),)),
                Turn(
                    tool_calls=(
                        ToolCall(
                            "Agent",
                            {
                                "description": "survey",
                                "prompt": "[script:busy-sub] survey the logs",
                                "subagent_type": "general-purpose",
                            },
                        ),
                        ToolCall(
                            "Bash",
                            {
                                "command": "echo started > started.txt; python3 -c 'import time; time.sleep(30)'",
                                "description": "long job",
                            },
                        ),
                    )
                ),
                Turn(text="done"),
            ],
        )
    )
    party.load_script(
        Script.build(
            "busy-sub",
            [
                Turn(tool_calls=(ToolCall("Bash", {"command": "tail -f /dev/null", "description": "watch"}),)),
                Turn(text="surveyed"),
            ],
        )
    )
    task = runtime.create_task("Run the long job")
    both_running = threading.Event()

    def commands_running() -> bool:
        # Both commands passed the boundary, and the long one has begun (its first line ran).
        running = WorkItem.objects.filter(task_id=task.id, label="Bash", state=S.RUNNING).count() == 2
        if running and (work / "started.txt").exists():
            time.sleep(0.5)  # the subagent's command, begun meanwhile
            return True
        return False

    watcher = when(commands_running, both_running)
    operator = stop_when(both_running, runtime, task.id)
    seen: dict[int, str] = {}

    def note_processes(message: Any) -> None:
        seen.update({pid: cmd for pid, cmd in session_processes_now().items()})

    marker_holder: list[str] = []

    def session_processes_now() -> dict[int, str]:
        return session_processes(marker_holder[0]) if marker_holder else {}

    opts = options(tmp_path, url.removesuffix("/v1"))
    began = time.monotonic()
    with pytest.raises(RunStopped):
        asyncio.run(
            _run_watching(runtime, task.id, "[script:busy] run the long job", opts, marker_holder, note_processes)
        )
    took = time.monotonic() - began
    watcher.join(5)
    operator.join(5)

    record = ledger(task.id)
    summary = task_summary(Task.objects.get(pk=task.id))
    with capsys.disabled():
        print(f"\n--- ledger of a run stopped mid-command and mid-subagent ---\n{record}\n--- summary ---\n{summary}\n")

    assert took < 25, "the 30 s command was not stopped"
    assert (work / "started.txt").read_text() == "started\n"  # it really ran, partway
    found = by_label(task.id)
    (the_run,) = [i for i in items(task.id) if i.noun == "agent run"]
    assert (the_run.state, the_run.outcome) == (S.CANCELLED, "stopped before it finished")
    assert the_run.evidence["interrupt"]["still_queued"] == []
    # The session's own command wrote before Stop and was killed partway: unknown outcome.
    (long_job,) = [i for i in found["Bash"] if "started.txt" in i.detail["tool"]["command"]["command"]]
    assert long_job.state == S.UNCERTAIN
    assert long_job.detail["tool"]["command"]["paths_written"] == [str(work / "started.txt")]
    assert long_job.detail["tool"]["command"]["effect"] == "local_write"
    # The subagent: a child run under the tool use that launched it, stopped by the interrupt,
    # and its read-only command under it, stopped.
    (launch,) = found["Agent"]
    assert launch.state == S.COMPLETED
    (sub,) = [i for i in items(task.id) if i.noun == "subagent run"]
    assert sub.parent_id == launch.pk
    assert (sub.state, sub.outcome) == (S.CANCELLED, "killed by the CLI after Stop's interrupt")
    (watching,) = [i for i in found["Bash"] if i.pk != long_job.pk]
    assert watching.parent_id == sub.pk
    # Read-only, so stopped: by the CLI's result for it, or, when the subagent was killed before
    # one came, at the run's end.
    assert watching.state == S.CANCELLED and watching.outcome in (
        "Bash: interrupted by Stop",
        "Bash: still in flight when the run ended after Stop",
    )
    (plan,) = found["Write"]
    assert plan.state == S.COMPLETED
    # The CLI and every process it started are gone.
    assert any("claude" in cmd for cmd in seen.values()), seen  # the marker found the CLI while it ran
    assert session_processes(marker_holder[0]) == {}
    assert summary == (
        "Stopped new work. One command with unknown outcome; review required. "
        "One agent run stopped before it finished. One command stopped before it finished. "
        "One subagent run stopped before it finished. One file edited. One subagent launch completed."
    )


async def _run_watching(
    runtime: Any, task_id: int, prompt: str, opts: ClaudeAgentOptions, marker: list[str], on_message: Any = None
) -> Any:
    from stopdesk.agent.frameworks import claude_agent_sdk as integration

    original = integration.Session.__init__

    def keep_marker(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        marker.append(self.marker)

    integration.Session.__init__ = keep_marker  # type: ignore[method-assign]
    try:
        return await run_agent(runtime, task_id, prompt, options=opts, on_message=on_message)
    finally:
        integration.Session.__init__ = original  # type: ignore[method-assign]


def test_a_tool_use_after_stop_is_refused_and_the_model_is_told(model, runtime, tmp_path):
    party, url = model
    work = tmp_path / "work"
    party.load_script(
        Script.build(
            "late",
            [
                Turn(tool_calls=(ToolCall("Bash", {"command": "echo one > one.txt", "description": "one"}),)),
                Turn(
                    tool_calls=(ToolCall("Write", {"file_path": str(work / "two.txt"), "content": "two\n"}),),
                    delay_s=1.5,
                ),
                Turn(text="stopped as asked"),
            ],
        )
    )
    task = runtime.create_task("Write two files")
    first_done = threading.Event()
    told: list[str] = []

    def on_message(message: Any) -> None:
        if isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    told.append(str(block.content))
                    first_done.set()

    operator = stop_when(first_done, runtime, task.id)
    # The push never arrives (watch=never): only the boundary stands between Stop and the tool.
    with pytest.raises(RunStopped):
        asyncio.run(
            run_agent(
                runtime,
                task.id,
                "[script:late] write two files",
                options=options(tmp_path, url.removesuffix("/v1")),
                on_message=on_message,
                watch=never,
            )
        )
    operator.join(5)

    assert (work / "one.txt").exists() and not (work / "two.txt").exists()
    found = by_label(task.id)
    (write,) = found["Write"]
    assert (write.state, write.started_at) == (S.CANCELLED, None)
    assert found["Bash"][0].state == S.COMPLETED
    assert any(STOPPED_RESULT in text for text in told), told


def test_a_process_that_outlives_the_cli_keeps_the_run_open_until_it_ends(model, runtime, tmp_path):
    party, url = model
    party.load_script(
        Script.build(
            "detached",
            [
                Turn(
                    tool_calls=(
                        ToolCall(
                            "Bash",
                            {
                                "command": "setsid python3 -c 'import time; time.sleep(4)' > /dev/null 2>&1 &",
                                "description": "start a worker",
                            },
                        ),
                    )
                ),
                Turn(tool_calls=(ToolCall("Bash", {"command": "tail -f /dev/null", "description": "watch"}),)),
                Turn(text="done"),
            ],
        )
    )
    task = runtime.create_task("Start a worker")
    watching = threading.Event()
    watcher = when(
        lambda: (
            WorkItem.objects.filter(task_id=task.id, label="Bash", state=S.RUNNING).exists()
            and WorkItem.objects.filter(task_id=task.id, label="Bash").count() == 2
        ),
        watching,
    )
    operator = stop_when(watching, runtime, task.id)
    marker: list[str] = []

    began = time.monotonic()
    with pytest.raises(RunStopped):
        asyncio.run(
            _run_watching(
                runtime,
                task.id,
                "[script:detached] start a worker",
                options(tmp_path, url.removesuffix("/v1")),
                marker,
                None,
            )
        )
    took = time.monotonic() - began
    watcher.join(5)
    operator.join(5)

    (the_run,) = [i for i in items(task.id) if i.noun == "agent run"]
    # The worker the first command left behind ran on after the CLI had gone: the run was noted
    # still running, and settled only once the worker ended.
    (left,) = the_run.evidence["processes"]
    assert "time.sleep(4)" in left["command"]
    assert the_run.evidence["uninterruptible"]
    assert (the_run.state, the_run.outcome) == (S.CANCELLED, "stopped before it finished")
    assert took >= 3.5
    assert session_processes(marker[0]) == {}
    first, second = by_label(task.id)["Bash"]
    assert first.state == S.COMPLETED and first.detail["tool"]["command"]["effect"] == "local_write"
    assert second.state == S.CANCELLED


def test_an_error_result_without_stop_fails_the_run(model, runtime, tmp_path):
    party, url = model
    party.load_script(
        Script.build(
            "turns",
            [
                Turn(tool_calls=(ToolCall("Bash", {"command": "ls", "description": "look"}),)),
                Turn(tool_calls=(ToolCall("Bash", {"command": "pwd", "description": "where"}),)),
                Turn(text="done"),
            ],
        )
    )
    task = runtime.create_task("Look around")
    opts = options(tmp_path, url.removesuffix("/v1"))
    opts.max_turns = 1

    with pytest.raises(SessionFailed) as failed:
        asyncio.run(run_agent(runtime, task.id, "[script:turns] look around", options=opts))

    assert failed.value.result.subtype == "error_max_turns"
    (the_run,) = [i for i in items(task.id) if i.noun == "agent run"]
    assert (the_run.state, the_run.outcome) == (
        S.FAILED,
        "SessionFailed: the Claude Code session ended with error_max_turns",
    )
    assert by_label(task.id)["Bash"][0].state == S.COMPLETED
