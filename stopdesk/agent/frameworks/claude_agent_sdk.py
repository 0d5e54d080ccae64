"""Claude Agent SDK (claude-agent-sdk 0.2.189, driving the Claude Code CLI 2.1.332): every tool use
in the ledger, subagents as child runs, and Stop.

    from claude_agent_sdk import ClaudeAgentOptions
    from stopdesk.agent.frameworks.claude_agent_sdk import run_agent

    options = ClaudeAgentOptions(cwd="/srv/repo", allowed_tools=["Bash", "Edit", "Write", "Agent"])
    result = await run_agent(runtime, task.id, "Fix the failing test", options=options)   # RunStopped on Stop

The session is the run's item. The CLI runs the tools itself (Bash, Edit/Write, WebFetch, Agent/Task
subagents, MCP tools), so the integration sits on the SDK's hooks (read in the installed package):

- `PreToolUse` (awaited by the CLI before the tool runs) registers the tool use as a child item and
  passes the boundary; after Stop it answers `permissionDecision: "deny"` with `STOPPED_RESULT` as
  the reason, which the model reads as the tool's result, so the tool never runs.
- `PostToolUse` / `PostToolUseFailure` record its result. A tool the interrupt stops gets neither:
  its end is read from the message stream (the `tool_result` the CLI writes for it).
- Each Bash command and file edit keeps what it touched in `detail.tool.command` / `detail.tool.files`: the
  command, its working directory, the paths it names as written (redirections, `tee`, and the
  path arguments of `cp`, `mv`, `rm`, `touch`, `mkdir`, `sed -i`, ...: what the command line
  says, not a scan of the disk), and its effect: `read_only`, `local_write`, `network`, or
  `unknown` (a program we cannot tell; treated as possibly destructive). Only a command known to
  be read-only counts as read-only: one Stop interrupts is then stopped, any other uncertain.
- A subagent (the `Agent` tool, `Task` in older CLIs) is a child run ("subagent run") under the
  tool use that launched it, registered at `SubagentStart`; the tool uses inside it carry its
  `agent_id` and are recorded under it. It settles with the status the CLI reports for its task
  (`task_updated` / `task_notification`): completed, failed, or stopped when it reports `killed` or
  `stopped`.

Stop arrives by push (`core.StopdeskRun`) and calls the client's interrupt, whose receipt (the
messages still queued) is noted on the run's item. The CLI then kills the tools in flight and
answers with an error result, which is a Stop here, not a failure (`RunStopped`); an error
result without Stop fails the run (`SessionFailed`). A subagent that
reports no end is recorded still running, asked to stop on its own (`stop_task`), and settled as
it ends (uncertain if it outlives `uninterruptible_s`). When the client disconnects, the CLI is
gone; any process it started that still runs (a command that detached from it) is found by a
marker in its environment (Linux, `/proc`), noted on the run's item as still running, and the run
settles only once they ended (uncertain if they outlive `uninterruptible_s`): never "stopped"
while something of it runs on. Model requests happen inside the CLI and are not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, HookMatcher, ResultMessage, SystemMessage, UserMessage
from claude_agent_sdk.types import ToolResultBlock

from stopdesk.agent.frameworks.core import STOPPED_RESULT, StopdeskRun
from stopdesk.agent.frameworks.declare import UNDECLARED, Effect, ToolDeclaration
from stopdesk.protocol.errors import StopRequested

FRAMEWORK = "claude-agent-sdk"
MARKER = "STOPDESK_CLAUDE_RUN"  # in the CLI's environment, inherited by every process it starts
SUBAGENT_TOOLS = frozenset({"Agent", "Task"})
FILE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite", "ListAgents", "TaskList", "TaskGet"})
WEB_TOOLS = frozenset({"WebFetch", "WebSearch"})
STOPPED_STATUSES = frozenset({"killed", "stopped"})
ENDED_STATUSES = frozenset({"completed", "failed", *STOPPED_STATUSES})
UNSTOPPED = "still running: the interrupt did not stop it; waiting for it to finish"

# Programs whose use on their own changes nothing (no redirection, no -i, no -exec).
READ_ONLY_PROGRAMS = frozenset(
    [
        "cat",
        "head",
        "tail",
        "less",
        "more",
        "ls",
        "ll",
        "pwd",
        "echo",
        "printf",
        "grep",
        "egrep",
        "fgrep",
        "rg",
        "ag",
        "find",
        "fd",
        "wc",
        "sort",
        "uniq",
        "cut",
        "tr",
        "diff",
        "cmp",
        "file",
        "stat",
        "du",
        "df",
        "which",
        "whereis",
        "type",
        "true",
        "false",
        "test",
        "[",
        "sleep",
        "date",
        "whoami",
        "id",
        "uname",
        "env",
        "printenv",
        "basename",
        "dirname",
        "realpath",
        "readlink",
        "jq",
        "yq",
        "tree",
        "nl",
        "od",
        "hexdump",
        "xxd",
        "md5sum",
        "sha1sum",
        "sha256sum",
        "ps",
        "top",
        "free",
        "uptime",
    ]
)
WRITE_PROGRAMS = frozenset(
    [
        "cp",
        "mv",
        "rm",
        "rmdir",
        "touch",
        "mkdir",
        "ln",
        "chmod",
        "chown",
        "tee",
        "sed",
        "truncate",
        "dd",
        "install",
        "patch",
        "tar",
        "unzip",
        "gzip",
        "gunzip",
        "make",
        "cmake",
        "python",
        "python3",
        "node",
        "npm-run",
        "pytest",
        "go",
        "cargo",
        "git",
    ]
)
NETWORK_PROGRAMS = frozenset(
    [
        "curl",
        "wget",
        "ssh",
        "scp",
        "sftp",
        "rsync",
        "nc",
        "ncat",
        "telnet",
        "ftp",
        "http",
        "https",
        "pip",
        "pip3",
        "npm",
        "npx",
        "yarn",
        "pnpm",
        "apt",
        "apt-get",
        "brew",
        "gh",
        "aws",
        "gcloud",
        "az",
        "kubectl",
        "docker",
        "helm",
        "uv",
        "poetry",
    ]
)
NETWORK_GIT = frozenset({"push", "pull", "fetch", "clone", "ls-remote"})
PATH_ARGUMENT_PROGRAMS = frozenset({"cp", "mv", "rm", "rmdir", "touch", "mkdir", "tee", "truncate", "ln"})
SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n", "(", ")", ";;"})
REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "1>", "2>", "2>>"})
WRAPPERS = frozenset({"sudo", "timeout", "nice", "nohup", "time", "setsid", "exec", "command"})


@dataclass(frozen=True)
class CommandFacts:
    """What a shell command line says it does."""

    effect: str  # read_only, local_write, network, unknown
    paths_written: tuple[str, ...] = ()


def classify_command(command: str, cwd: str = "") -> CommandFacts:
    """Read a command line: the effect of its strongest part and the paths it names as written."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return CommandFacts("unknown")
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(token)
    effects: set[str] = set()
    written: list[str] = []
    for words in parts:
        named: list[str] = []
        plain: list[str] = []
        redirected = False
        for index, word in enumerate(words):
            if word in REDIRECTS:
                redirected = True
                target = words[index + 1] if index + 1 < len(words) else ""
                if target and not target.startswith("&") and target != "/dev/null":
                    named.append(target)
            elif index == 0 or words[index - 1] not in REDIRECTS:
                plain.append(word)
        while plain and "=" in plain[0] and not plain[0].startswith("="):
            plain = plain[1:]  # VAR=value before the program
        while plain and plain[0] in WRAPPERS:
            plain = [w for w in plain[1:] if not re.fullmatch(r"-\S*|\d+[smhd]?", w)]
        if not plain:
            effects.add("local_write" if named else "read_only")
            written += named
            continue
        program, args = Path(plain[0]).name, plain[1:]
        if program in PATH_ARGUMENT_PROGRAMS or (program == "sed" and "-i" in args):
            operands = [a for a in args if not a.startswith("-")]
            named += operands[1:] if program == "sed" else operands  # sed's first operand is its script
        if program in NETWORK_PROGRAMS or (program == "git" and args and args[0] in NETWORK_GIT):
            effects.add("network")
        elif program in READ_ONLY_PROGRAMS and not redirected and "-i" not in args and "-exec" not in args:
            effects.add("read_only")
        elif program in WRITE_PROGRAMS or redirected:
            effects.add("local_write")
        else:
            effects.add("unknown")
        if named:
            effects.add("local_write")
        written += named
    strongest = next((e for e in ("network", "unknown", "local_write", "read_only") if e in effects), "read_only")
    base = Path(cwd) if cwd else None
    paths = tuple(dict.fromkeys(str(base / p) if base and not os.path.isabs(p) else p for p in written))
    return CommandFacts(strongest, paths)


def tool_facts(
    name: str, tool_input: dict[str, Any], cwd: str, declarations: dict[str, ToolDeclaration]
) -> tuple[ToolDeclaration, str, dict[str, Any]]:
    """(declaration, kind, detail) of one tool use: what it does, as the ledger keeps it."""
    if name in declarations:
        return declarations[name], "remote_tool" if name.startswith("mcp__") else "", {}
    if name == "Bash":
        facts = classify_command(str(tool_input.get("command", "")), cwd)
        effect: Effect = "read_only" if facts.effect == "read_only" else "unknown"
        detail = {
            "command": {
                "command": str(tool_input.get("command", ""))[:2000],
                "cwd": cwd,
                "effect": facts.effect,
                "paths_written": list(facts.paths_written),
                "background": bool(tool_input.get("run_in_background")),
            },
            "told": {"noun": "command", "nouns": "commands", "done": "ran"},
        }
        return ToolDeclaration(effect=effect, noun="command"), "", detail
    if name in FILE_TOOLS:
        path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
        told = {"noun": "file", "nouns": "files", "done": "edited"}
        return (
            ToolDeclaration(noun="file edit"),
            "",
            {"files": {"paths_written": [path], "effect": "local_write"}, "told": told},
        )
    if name in READ_TOOLS:
        return ToolDeclaration(effect="read_only", noun="lookup"), "", {"files": {"effect": "read_only"}}
    if name in WEB_TOOLS:
        return ToolDeclaration(effect="read_only", noun="web lookup"), "", {"web": {"effect": "network"}}
    if name in SUBAGENT_TOOLS:
        return ToolDeclaration(effect="read_only", noun="subagent launch"), "", {}
    if name.startswith("mcp__"):
        server, _, tool = name.removeprefix("mcp__").partition("__")
        return ToolDeclaration(noun=f"{tool or name} call"), "remote_tool", {"mcp": {"server": server, "tool": tool}}
    return UNDECLARED, "", {}


class ToolFailed(Exception):
    """The CLI reported the tool use failed (PostToolUseFailure, or an error result)."""


class SessionFailed(Exception):
    """The session ended with an error result (`result`: the CLI's ResultMessage), not by Stop:
    the run is recorded failed with its subtype (`error_max_turns`, `error_during_execution`)."""

    def __init__(self, result: ResultMessage) -> None:
        super().__init__(f"the Claude Code session ended with {result.subtype}")
        self.result = result


class _Interrupted(Exception):
    """The session ended because Stop interrupted it (the CLI's error result after an interrupt)."""


@dataclass
class _Flight:
    task: asyncio.Task[Any]
    outcome: asyncio.Future[Any]
    name: str


@dataclass
class _Subagent:
    agent_id: str
    item_id: int | None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Session:
    """One Claude Code session under a StopdeskRun: the hooks, what the message stream says, Stop."""

    def __init__(
        self,
        run: StopdeskRun,
        *,
        declarations: dict[str, ToolDeclaration] | None = None,
        on_message: Callable[[Any], Any] | None = None,
        uninterruptible_s: float = 300.0,
    ) -> None:
        self.run = run
        self.uninterruptible_s = uninterruptible_s
        self.declarations = dict(declarations or {})
        self.on_message = on_message
        self.marker = uuid.uuid4().hex
        self.client: ClaudeSDKClient | None = None
        self.flights: dict[str, _Flight] = {}
        self.launched_by: dict[str, str] = {}  # subagent (task) id -> the tool use that launched it
        self.subagents: dict[str, _Subagent] = {}
        self.items: dict[str, int] = {}  # tool use id -> its item
        self.refusing = 0  # tool uses waiting for the boundary's answer
        self.refused = 0
        self.receipt: dict[str, Any] | None = None
        self.result: ResultMessage | None = None

    # --- options -------------------------------------------------------------------------------

    def options(self, options: ClaudeAgentOptions) -> ClaudeAgentOptions:
        hooks = {event: list(matchers) for event, matchers in (options.hooks or {}).items()}
        ours: dict[Any, Any] = {
            "PreToolUse": self.pre_tool_use,
            "PostToolUse": self.post_tool_use,
            "PostToolUseFailure": self.post_tool_use_failure,
            "SubagentStart": self.subagent_start,
        }
        for event, hook in ours.items():
            # First, so the boundary answers before any hook of the application's lets the tool run.
            hooks[event] = [HookMatcher(hooks=[hook]), *hooks.get(event, [])]
        return dataclasses.replace(options, hooks=hooks, env={**options.env, MARKER: self.marker})

    # --- hooks ---------------------------------------------------------------------------------

    async def pre_tool_use(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        call_id = str(data.get("tool_use_id") or tool_use_id or "")
        name = str(data.get("tool_name", ""))
        tool_input = data.get("tool_input") or {}
        declaration, kind, extra = tool_facts(name, tool_input, str(data.get("cwd", "")), self.declarations)
        parent = None
        if data.get("agent_id") in self.subagents:
            parent = self.subagents[str(data["agent_id"])].item_id
        passed = asyncio.Event()
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def body() -> Any:
            item_id = self.run.item_of(call_id)
            if item_id is not None:
                self.items[call_id] = item_id
            passed.set()
            return await outcome

        task = asyncio.ensure_future(
            self.run.tool_call(
                call_id=call_id,
                name=name,
                arguments=tool_input if isinstance(tool_input, dict) else {"input": str(tool_input)},
                body=body,
                declaration=declaration,
                kind=kind,
                extra=extra,
                parent=parent,
                stopped_result=_REFUSED,
            )
        )
        waiting = asyncio.ensure_future(passed.wait())
        self.refusing += 1
        try:
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.refusing -= 1
            waiting.cancel()
        if passed.is_set():
            self.flights[call_id] = _Flight(task, outcome, name)
            return {}
        if task.exception() is None and task.result() is _REFUSED:
            self.refused += 1
            return _deny(STOPPED_RESULT)
        # The ledger could not be asked: the boundary is unknown, so the tool does not run.
        return _deny(f"stopdesk could not record this tool use ({task.exception()!r}); it was not run.")

    async def post_tool_use(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        flight = self.flights.pop(str(data.get("tool_use_id") or tool_use_id or ""), None)
        if flight is not None and not flight.outcome.done():
            flight.outcome.set_result(_text(data.get("tool_response")))
        return {}

    async def post_tool_use_failure(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        flight = self.flights.pop(str(data.get("tool_use_id") or tool_use_id or ""), None)
        if flight is not None and not flight.outcome.done():
            if data.get("is_interrupt"):
                flight.task.cancel()
            else:
                flight.outcome.set_exception(ToolFailed(str(data.get("error", ""))[:500]))
        return {}

    async def subagent_start(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        agent_id = str(data.get("agent_id", ""))
        if not agent_id or agent_id in self.subagents:
            return {}
        launcher = self.launched_by.get(agent_id)
        if launcher is None:
            pending = [call for call, f in self.flights.items() if f.name in SUBAGENT_TOOLS]
            launcher = pending[0] if len(pending) == 1 else None
        parent = self.items.get(launcher) if launcher else None
        agent_type = str(data.get("agent_type", ""))
        try:
            item_id: int | None = await self.run.register_started(
                kind="local_worker",
                noun="subagent run",
                label=f"subagent {agent_type}".strip(),
                handle=agent_id,
                detail={"agent_run": {"framework": FRAMEWORK, "agent": agent_type, "subagent": agent_id}},
                **({"parent": parent} if parent else {}),
            )
        except StopRequested:
            item_id = None  # refused: its tool uses are refused at the boundary too
        self.subagents[agent_id] = _Subagent(agent_id, item_id)
        return {}

    # --- the message stream --------------------------------------------------------------------

    async def consume(self) -> ResultMessage | None:
        """Read the session's messages until its result (and its subagents' ends). After Stop:
        once the CLI answered the interrupt with its result, a subagent still open is one the
        interrupt did not stop (noted still running, asked to stop on its own) and is waited for,
        up to `uninterruptible_s`; then `_Interrupted`. A CLI that does not answer the interrupt
        within the run's cleanup time ends the wait too."""
        assert self.client is not None
        loop = asyncio.get_running_loop()
        stream = self.client.receive_messages().__aiter__()
        stopped_at: float | None = None
        answered = False
        while True:
            timeout = None
            if self.run.stopped.is_set():
                stopped_at = loop.time() if stopped_at is None else stopped_at
                if answered and not self._open_subagents():
                    raise _Interrupted("the CLI answered the interrupt")
                limit = self.uninterruptible_s if answered else self.run.cleanup_s
                timeout = max(0.0, stopped_at + limit - loop.time())
            try:
                message = await asyncio.wait_for(anext(stream), timeout)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise _Interrupted("the session did not end in time after the interrupt") from None
            self.observe(message)
            if self.on_message is not None:
                self.on_message(message)
            if isinstance(message, ResultMessage):
                self.result = message
                if self.run.stopped.is_set():
                    answered = True
                    self.run.later(self._stop_subagents(), "subagents")
                elif message.is_error:
                    raise SessionFailed(message)
                elif not self._open_subagents():
                    return message
        if self.run.stopped.is_set():
            raise _Interrupted("the CLI ended")
        return self.result

    def observe(self, message: Any) -> None:
        if isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self._tool_result(block)
        elif isinstance(message, SystemMessage):
            data = message.data
            task_id = str(data.get("task_id") or "")
            if message.subtype == "task_started" and data.get("tool_use_id"):
                self.launched_by[task_id] = str(data["tool_use_id"])
            status = str(data.get("status") or (data.get("patch") or {}).get("status") or "")
            if message.subtype in ("task_updated", "task_notification") and status in ENDED_STATUSES:
                self._subagent_ended(task_id, status, str(data.get("summary") or ""))

    def _tool_result(self, block: ToolResultBlock) -> None:
        flight = self.flights.get(block.tool_use_id)
        if flight is None or flight.outcome.done():
            return
        self.flights.pop(block.tool_use_id, None)
        if self.run.stopped.is_set():
            flight.task.cancel()  # the interrupt ended it: core records it stopped or uncertain
        elif block.is_error:
            flight.outcome.set_exception(ToolFailed(_text(block.content)[:500]))
        else:
            flight.outcome.set_result(_text(block.content))

    def _subagent_ended(self, agent_id: str, status: str, summary: str) -> None:
        sub = self.subagents.get(agent_id)
        if sub is None or sub.ended.is_set():
            return
        sub.ended.set()
        if sub.item_id is None:
            return
        if status in STOPPED_STATUSES:
            work = self.run.report_stopped(sub.item_id, f"{status} by the CLI after Stop's interrupt")
        else:
            work = self.run.report(
                sub.item_id, status="completed" if status == "completed" else "failed", detail=summary
            )
        self.run.later(work, f"subagent {agent_id}")

    def _open_subagents(self) -> list[_Subagent]:
        return [s for s in self.subagents.values() if not s.ended.is_set()]

    # --- Stop ----------------------------------------------------------------------------------

    async def interrupt(self) -> None:
        """Stop's cancel: the client's interrupt, its receipt noted on the run's item."""
        if self.client is None:
            return
        # A tool use the boundary is refusing right now: its answer (the reason the model reads)
        # goes to the CLI before the interrupt, which would otherwise replace it with its own.
        for _ in range(20):
            if not self.refusing:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05 if self.refused else 0)
        query = getattr(self.client, "_query", None)
        send = getattr(query, "_send_control_request", None)
        try:
            if send is not None:
                # The receipt (`still_queued`: prompts the CLI had not begun) is what `interrupt()`
                # drops; the same control request, read.
                self.receipt = await send({"subtype": "interrupt"})
            else:
                await self.client.interrupt()
                self.receipt = {}
        except Exception as exc:
            self.receipt = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        queued = list((self.receipt or {}).get("still_queued") or [])
        await self.run.note(
            f"interrupt sent to the CLI; {len(queued)} queued message(s) will not run",
            {
                "interrupt": {
                    "still_queued": _clip_list(queued),
                    **({"error": self.receipt["error"]} if "error" in (self.receipt or {}) else {}),
                }
            },
        )

    async def _stop_subagents(self) -> None:
        """A subagent the interrupt did not end: noted still running, asked to stop on its own."""
        for sub in self._open_subagents():
            if sub.item_id is not None:
                await self.run.note_item(
                    sub.item_id, f"subagent {sub.agent_id}: {UNSTOPPED}", {"uninterruptible": UNSTOPPED}
                )
            with contextlib.suppress(Exception):
                assert self.client is not None
                await self.client.stop_task(sub.agent_id)

    async def after_cli(self, uninterruptible_s: float) -> None:
        """Once the CLI is gone: tool uses nobody reported (interrupted), subagents that never said
        how they ended, and processes of the session that still run."""
        for flight in list(self.flights.values()):
            flight.task.cancel()
        self.flights.clear()
        for sub in self._open_subagents():
            sub.ended.set()
            if sub.item_id is not None:
                detail = "the session ended before the subagent reported how it ended"
                self.run.later(self.run.uncertain(sub.item_id, detail), f"subagent {sub.agent_id}")
        left = session_processes(self.marker)
        if not left:
            return
        await self.run.note(
            f"{len(left)} process(es) the agent started still run after the CLI exited; waiting for them to finish",
            {"uninterruptible": UNSTOPPED, "processes": [{"pid": p, "command": c[:200]} for p, c in left.items()]},
        )
        deadline = asyncio.get_running_loop().time() + uninterruptible_s
        while session_processes(self.marker) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        still = session_processes(self.marker)
        if still:
            await self.run.give_up_run(
                f"{len(still)} process(es) the agent started still run {uninterruptible_s:g} s after Stop"
            )


_REFUSED = object()


def _deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text(v.get("text", "")) if isinstance(v, dict) else _text(v) for v in value)
    if isinstance(value, dict):
        for key in ("stdout", "content", "text", "result", "status"):
            if isinstance(value.get(key), str) and value[key]:
                return value[key]
        return json.dumps(value, default=str)[:2000]
    return "" if value is None else str(value)


def _clip_list(values: list[Any]) -> list[Any]:
    return [
        v if len(json.dumps(v, default=str)) <= 500 else {"truncated": json.dumps(v, default=str)[:500]}
        for v in values[:20]
    ]


def session_processes(marker: str) -> dict[int, str]:
    """The processes (pid -> command line) whose environment carries the session's marker: the
    CLI and whatever it started, also after they left its process tree. Linux (`/proc`) only."""
    found: dict[int, str] = {}
    needle = f"{MARKER}={marker}".encode()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                )
        except OSError:
            continue  # gone, or not ours to read
    return {pid: cmd for pid, cmd in found.items() if not _zombie(pid)}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


async def run_agent(
    runtime: Any,
    task_id: int,
    prompt: str,
    *,
    options: ClaudeAgentOptions | None = None,
    declarations: dict[str, ToolDeclaration] | None = None,
    on_message: Callable[[Any], Any] | None = None,
    cleanup_s: float = 5.0,
    watch: Any = None,
    poll_s: float = 0.2,
    uninterruptible_s: float = 300.0,
) -> ResultMessage | None:
    """One Claude Code session under `task_id`: `prompt`, then its messages until the result (and
    its subagents' ends). Stop interrupts it (RunStopped). `declarations`: what tools do by name
    (an MCP server's `mcp__<server>__<tool>`), which wins over what stopdesk reads of built-ins."""
    options = options or ClaudeAgentOptions()
    async with StopdeskRun(
        runtime,
        task_id,
        framework=FRAMEWORK,
        agent=str(options.model or ""),
        cleanup_s=cleanup_s,
        watch=watch,
        poll_s=poll_s,
        uninterruptible_s=uninterruptible_s,
    ) as run:
        session = Session(run, declarations=declarations, on_message=on_message, uninterruptible_s=uninterruptible_s)
        try:
            async with ClaudeSDKClient(session.options(options)) as client:
                session.client = client
                await client.query(prompt)
                result = await run.run(session.consume(), cancel=session.interrupt, stopped_errors=(_Interrupted,))
        finally:
            await session.after_cli(uninterruptible_s)
    return result
