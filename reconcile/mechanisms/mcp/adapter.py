"""MCP tool calls through the official `mcp` SDK: the reconciler's side.

The agent side (`mcp_agent`) makes the calls and owns their sessions; this adapter reads back what
it can from the reconciler's process:

- A plain call is cancelled by its caller's scope (the SDK sends `notifications/cancelled`, or on
  2026-07-28 over HTTP closes the call's response stream), and no answer follows a cancelled call. While the caller lives, it reports; once it is gone, a
  read-only tool had nothing to reconcile and any other tool is unknown, unless the tool declares
  a *status check* (another, read-only tool on the same server, e.g. `git_log` for `git_commit`):
  then the reconciler calls that tool until the mechanism's deadline and settles the item
  completed when it shows the effect, or leaves it uncertain with the answer attached.
- A task-augmented call (protocol 2025-11-25) lives in the session that created it: servers keep
  tasks per session (server-everything cleans them up when the session closes, and answers
  `-32602 Task not found` on any other session). The agent process that created the task keeps
  that session open, cancels and reads back through it, and records what it saw. While it holds
  its lease this adapter only waits. When it is gone, the adapter resumes the session by its id
  (Streamable HTTP keeps a session until it is deleted or times out); when that fails, or the
  server was a stdio process that died with its owner, the task is uncertain, and the evidence
  says the session's owner stopped, not that the task "expired".
- A 2026-07-28 task (the `io.modelcontextprotocol/tasks` extension) has no session: once its owner
  is gone, the adapter cancels and reads it back by its id (`Mcp-Name` routes to its holder). The
  empty acknowledgement proves nothing; the `tasks/get` that follows is what is read.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import mcp_types as types
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.base import LEDGER_FINAL, Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen
from reconcile.mechanisms.mcp import servers as mcp_servers
from stopdesk.states import ItemState

log = logging.getLogger(__name__)
INVALID_PARAMS = -32602
PROTOCOL_VERSION = "2025-11-25"
TASK_STATUS = {
    "working": Seen.RUNNING,
    "input_required": Seen.RUNNING,
    "completed": Seen.COMPLETED,
    "failed": Seen.FAILED,
    "cancelled": Seen.CANCELLED,
}
OWNER_GONE = (
    "The agent process that owned the MCP session holding this task stopped renewing its lease (it "
    "ended, or lost the database) before the task was reconciled, and the server keeps tasks per "
    "session: {what}. Whether the task ran, and what it did, is unknown."
)
NOT_FOUND_AT_ONCE = (
    "The server answered 'task not found' for the task it had just created "
    "({after_ms} ms after creating it): it may never have run, or the server dropped it at once."
)


def annotations_of(tool: types.Tool) -> dict[str, Any]:
    hints = tool.annotations
    # The spec's defaults when a hint is absent: not read-only, destructive, not idempotent, open world.
    return {
        "readOnlyHint": bool(hints and hints.read_only_hint),
        "destructiveHint": True if hints is None or hints.destructive_hint is None else hints.destructive_hint,
        "idempotentHint": bool(hints and hints.idempotent_hint),
        "openWorldHint": True if hints is None or hints.open_world_hint is None else hints.open_world_hint,
    }


def task_observation(task: dict[str, Any], annotations: dict[str, Any], *, cancel: str = "") -> Observation:
    """What a `tasks/get` answer (a Task as JSON) means for the item."""
    status = str(task.get("status"))
    detail: dict[str, Any] = {"task_id": task.get("taskId"), "status": status}
    if task.get("statusMessage"):
        detail["status_message"] = task["statusMessage"]
    if cancel:
        detail["cancel"] = cancel
    if status == "cancelled" and not annotations.get("readOnlyHint"):
        # The spec has the receiver set `cancelled` before it even tries to stop the work, and
        # keep it even if the work then finishes: for a tool that may change the world, the
        # status proves nothing about its effect (the drills caught an export landing anyway).
        return Observation(
            Seen.UNKNOWABLE,
            remote_status=status,
            message=(
                "The server marked the task cancelled, which MCP keeps even if the work goes on; "
                "the tool is not read-only, so whether it took effect is unknown."
            ),
            detail=detail,
            cancel_sent=bool(cancel),
        )
    seen = TASK_STATUS.get(status, Seen.UNREACHABLE)
    return Observation(seen, remote_status=status, detail=detail, cancel_sent=bool(cancel))


def status_check_observation(answer: types.CallToolResult, check: dict[str, Any]) -> Observation:
    """Judge a status check's answer: the effect is there, or not (yet)."""
    text = " ".join(getattr(c, "text", "") for c in answer.content)
    found = check.get("completed_if_contains") or ""
    detail = {
        "status_check": {
            "tool": check["tool"],
            "arguments": check.get("arguments") or {},
            "looked_for": found,
            "answer": text[:1000],
            "is_error": bool(answer.is_error),
        }
    }
    if not answer.is_error and found and found in text:
        return Observation(
            Seen.COMPLETED,
            remote_status=f"{check['tool']}: found",
            message=f"The status check ({check['tool']}) shows the effect: it found {found!r}.",
            detail=detail,
            outcome=f"completed; {check['tool']} shows it took effect",
        )
    why = "answered with an error" if answer.is_error else f"did not show {found!r}"
    return Observation(
        Seen.RUNNING,
        remote_status=f"{check['tool']}: not found",
        message=f"The status check ({check['tool']}) {why}; looking again until the deadline.",
        detail=detail,
        if_deadline=(
            f"The status check ({check['tool']}) still did not show the effect at the mechanism's deadline; "
            "its last answer is attached. The call may not have taken effect, or may yet."
        ),
    )


async def run_status_check(spec: mcp_servers.ServerSpec, check: dict[str, Any], timeout_s: float) -> Observation:
    async with mcp_servers.open_client(spec, timeout_s=timeout_s) as conn:
        answer = await conn.client.call_tool(check["tool"], check.get("arguments") or {})
    return status_check_observation(answer, check)


class McpToolCall(Mechanism):
    name = "mcp"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})
    defaults = MechanismSettings(
        call_timeout_s=10.0, deadline_s=300.0, backoff_initial_s=1.0, backoff_max_s=30.0, recheck_interval_s=2.0
    )

    def can(self, capability: Capability, item: ItemRef | None = None) -> bool:
        if item is None:
            return capability in self.capabilities
        facts = item.detail.get("mcp") or {}
        if capability == Capability.CANCEL:
            return _is_task(item)  # a plain call is cancelled by its caller's scope, not from here
        if capability == Capability.INSPECT and facts.get("tool"):
            # A read-only tool has nothing to reconcile; a task has tasks/get; any other call can
            # only be looked at through a status check (recorded with the call, or configured).
            annotations = facts.get("annotations") or {}
            return bool(
                _is_task(item)
                or annotations.get("readOnlyHint")
                or _status_check(item)
                or self._configured_check(facts)
            )
        return capability in self.capabilities

    def _configured_check(self, facts: dict[str, Any]) -> bool:
        try:
            server = mcp_servers.configured_servers(self.settings.options).get(str(facts.get("server") or ""))
        except mcp_servers.ServerConfigError:
            return False
        return server is not None and str(facts["tool"]) in server.status_checks

    def cancel(self, item: ItemRef) -> Observation:
        if not _is_task(item):
            return self.inspect(item)
        return self._task(item, cancel=True)

    def inspect(self, item: ItemRef) -> Observation:
        if _is_task(item):
            return self._task(item, cancel=False)
        return self._plain_call(item)

    # --- tasks ---------------------------------------------------------------------------

    def _task(self, item: ItemRef, *, cancel: bool) -> Observation:
        facts = item.detail.get("mcp") or {}
        session = facts.get("session") or {}
        if session.get("ended"):
            # The owner reconciled the task through its session and closed it; nothing more can be asked.
            return Observation(Seen.UNKNOWABLE, remote_status="session closed by its owner", message=session["ended"])
        if item.state == ItemState.RUNNING and _owner_alive(item):
            return Observation(
                Seen.RUNNING,
                remote_status="session owner alive",
                message=f"The agent process {session.get('owner', '?')} holds the task's session and cancels through it.",
            )
        if facts.get("transport") == mcp_servers.STDIO:
            return _owner_gone("the server was a stdio process of that agent and ended with it")
        modern = mcp_servers.is_modern(facts.get("revision"))
        if not modern and not session.get("id"):
            return _owner_gone("its session id was never learned, so the session cannot be resumed")
        try:
            spec = mcp_servers.from_detail(facts, self.settings.options)
            if modern:
                return _by_task_id(spec, item, cancel=cancel, timeout_s=self.settings.call_timeout_s)
            return _resume(spec, session["id"], item, cancel=cancel, timeout_s=self.settings.call_timeout_s)
        except (httpx.HTTPError, OSError, mcp_servers.ServerConfigError) as exc:
            return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__, message=str(exc)[:200])

    # --- plain calls ---------------------------------------------------------------------

    def _plain_call(self, item: ItemRef) -> Observation:
        """A plain call's caller records its end in the ledger; read it back from there, or look
        through the tool's status check."""
        if item.state in LEDGER_FINAL:
            return Observation(LEDGER_FINAL[item.state], remote_status=f"ledger: {item.state}")
        check = _status_check(item)
        caller_alive = item.lease_until is not None and item.lease_until > datetime.now(UTC)
        if item.state == ItemState.RUNNING and caller_alive:
            return Observation(Seen.RUNNING, remote_status="caller alive", message="The caller cancels its own call.")
        annotations = (item.detail.get("mcp") or {}).get("annotations") or {}
        if annotations.get("readOnlyHint"):
            return Observation(
                Seen.NO_EFFECT, remote_status="caller gone", message="read-only tool; nothing to reconcile"
            )
        if check:
            try:
                facts = item.detail.get("mcp") or {}
                spec = mcp_servers.from_detail(facts, self.settings.options)
                configured = spec.status_checks.get(str(facts.get("tool") or ""))
                if configured is None or configured.tool != check["tool"]:
                    # Which tool the server calls is configuration; the item only fills in its arguments.
                    raise mcp_servers.ServerConfigError(
                        f"no status check {check['tool']!r} is configured for {facts.get('tool')!r} on {spec.name!r}"
                    )
                return anyio.run(run_status_check, spec, check, self.settings.call_timeout_s)
            except mcp_servers.ServerConfigError as exc:
                return Observation(Seen.UNKNOWABLE, remote_status="status check impossible", message=str(exc))
            except Exception as exc:  # the transport wraps connection failures in exception groups
                return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__, message=str(exc)[:200])
        return Observation(
            Seen.UNKNOWABLE,
            remote_status="caller gone",
            message=(
                "The call may have changed the world, MCP has no status lookup for plain calls, "
                "and no status check is declared for this tool."
            ),
        )


def _is_task(item: ItemRef) -> bool:
    return bool(item.handle) and bool((item.detail.get("mcp") or {}).get("server_tasks"))


def _status_check(item: ItemRef) -> dict[str, Any] | None:
    check = (item.detail.get("mcp") or {}).get("status_check")
    return check if isinstance(check, dict) and check.get("tool") else None


def _owner_alive(item: ItemRef) -> bool:
    return item.lease_until is not None and item.lease_until > datetime.now(UTC)


def _owner_gone(what: str, detail: dict[str, Any] | None = None) -> Observation:
    return Observation(
        Seen.UNKNOWABLE,
        remote_status="session owner gone",
        message=OWNER_GONE.format(what=what),
        detail=detail or {},
        outcome="task's session lost with its owner; investigate",
    )


def _resume(
    spec: mcp_servers.ServerSpec, session_id: str, item: ItemRef, *, cancel: bool, timeout_s: float
) -> Observation:
    """Speak in the owner's session (by its id, without a new handshake): the only session in
    which a per-session server still knows the task."""
    annotations = (item.detail.get("mcp") or {}).get("annotations") or {}
    headers = {
        **spec.http_headers(),
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Session-Id": session_id,
        "MCP-Protocol-Version": PROTOCOL_VERSION,
    }
    cancel_answer = ""
    with httpx.Client(timeout=timeout_s, headers=headers) as http:
        if cancel:
            status, answer = _rpc(http, spec.url, "tasks/cancel", {"taskId": item.handle})
            if status in (400, 404):
                return _owner_gone(f"the server no longer has its session (HTTP {status} on resuming it)")
            error = answer.get("error") or {}
            if error and error.get("code") != INVALID_PARAMS:
                return Observation(Seen.UNREACHABLE, remote_status=f"{error.get('code')}", message=str(error)[:200])
            cancel_answer = "-32602; looked it up" if error else "accepted (resumed session)"
        status, answer = _rpc(http, spec.url, "tasks/get", {"taskId": item.handle})
    if status in (400, 404):
        return _owner_gone(f"the server no longer has its session (HTTP {status} on resuming it)")
    error = answer.get("error") or {}
    if error.get("code") == INVALID_PARAMS:
        return _owner_gone("the server does not know the task on its session any more (-32602)")
    if error:
        return Observation(Seen.UNREACHABLE, remote_status=f"{error.get('code')}", message=str(error)[:200])
    return task_observation(answer.get("result") or {}, annotations, cancel=cancel_answer)


TASK_GONE = (
    "The server no longer knows the task (-32602: its TTL ran out, or the server deleted it, which "
    "2026-07-28 allows at any time); whether it took effect is unknown."
)


def _by_task_id(spec: mcp_servers.ServerSpec, item: ItemRef, *, cancel: bool, timeout_s: float) -> Observation:
    """2026-07-28: no session; the task id is the whole handle. `tasks/cancel` answers an empty
    acknowledgement, which proves nothing: only the `tasks/get` that follows is read."""
    annotations = (item.detail.get("mcp") or {}).get("annotations") or {}
    cancel_answer = ""
    with httpx.Client(timeout=timeout_s, headers=spec.http_headers()) as http:
        if cancel:
            status, answer = modern_task_rpc(http, spec.url, "tasks/cancel", item.handle)
            error = answer.get("error") or {}
            if status in (400, 404) or (error and error.get("code") != INVALID_PARAMS):
                return Observation(Seen.UNREACHABLE, remote_status=f"HTTP {status}", message=str(error)[:200])
            cancel_answer = "-32602; looked it up" if error else "empty acknowledgement (proves nothing)"
        status, answer = modern_task_rpc(http, spec.url, "tasks/get", item.handle)
    error = answer.get("error") or {}
    if error.get("code") == INVALID_PARAMS:
        return Observation(
            Seen.UNKNOWABLE,
            remote_status="-32602",
            message=TASK_GONE,
            detail={"task_id": item.handle, "cancel": cancel_answer},
            cancel_sent=cancel,
        )
    if status in (400, 404) or error:
        return Observation(Seen.UNREACHABLE, remote_status=f"HTTP {status}", message=str(error)[:200])
    return task_observation(answer.get("result") or {}, annotations, cancel=cancel_answer)


def modern_task_rpc(http: httpx.Client, url: str, method: str, task_id: str) -> tuple[int, dict[str, Any]]:
    """A 2026-07-28 `tasks/get` or `tasks/cancel` of a task by its id alone: (HTTP status, the
    JSON-RPC answer). 400 and 404 come back as ({}); other HTTP errors raise."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": mcp_servers.MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "stopdesk-reconciler", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {mcp_servers.TASKS_EXTENSION: {}}},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": mcp_servers.MODERN,
        "Mcp-Method": method,
        "Mcp-Name": task_id,  # routes to the instance holding the task
    }
    return _rpc(http, url, method, {"taskId": task_id, "_meta": meta}, headers=headers)


def _rpc(
    http: httpx.Client, url: str, method: str, params: dict[str, Any], *, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    response = http.post(url, content=body, headers=headers)
    if response.status_code in (400, 404):
        return response.status_code, {}
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                payload = json.loads(line[5:].strip() or "null")
                if isinstance(payload, dict) and payload.get("id") == 1:
                    return response.status_code, payload
        return response.status_code, {"error": {"code": -32603, "message": "no answer in the event stream"}}
    payload = response.json()
    return response.status_code, payload if isinstance(payload, dict) else {}


__all__ = ["MCPError", "McpToolCall", "annotations_of", "modern_task_rpc", "run_status_check", "task_observation"]


ADAPTER = McpToolCall
