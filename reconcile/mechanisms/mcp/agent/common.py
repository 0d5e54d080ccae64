"""What plain calls and tasks share: the facts recorded before a call, the boundary, and how a
failure between registration and the answer is recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp.adapter import annotations_of
from reconcile.mechanisms.mcp.servers import TASKS_EXTENSION, Connection, ServerSpec
from stopdesk.agent.aio import in_thread
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import item_record_detail, item_state_of
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState

log = logging.getLogger(__name__)
ServerRef = str | StdioServerParameters | ServerSpec


async def describe(conn: Connection, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The facts recorded on the item before the call: the server (never its secrets), the tool,
    the revision and transport used (and how a cancel travels on them), the tool's annotations, and its status check with arguments filled in."""
    found = _tool_named(await conn.list_tools(), tool)
    if found is None:  # a list kept from earlier may predate the tool: ask again once
        conn.tools = None
        found = _tool_named(await conn.list_tools(), tool)
    if found is None:
        raise LookupError(f"MCP server {conn.spec.name} has no tool {tool!r}")
    return Described.of(conn).facts(tool, arguments)


@dataclass(frozen=True)
class Described:
    """What a connection knows of its server, read while it is open, to describe calls from
    (without it, once it is closed)."""

    spec: ServerSpec
    revision: dict[str, Any]
    server_name: str
    server_tasks: bool
    tools: Any  # the ListToolsResult

    @classmethod
    def of(cls, conn: Connection) -> Described:
        client = conn.client
        return cls(
            spec=conn.spec,
            revision=conn.revision_facts(),
            server_name=client.server_info.name if client.server_info else "",
            server_tasks=offers_tasks(client.server_capabilities),
            tools=conn.tools,
        )

    def knows(self, tool: str) -> bool:
        return self.tools is not None and _tool_named(self.tools, tool) is not None

    def facts(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        found = _tool_named(self.tools, tool)
        if found is None:
            raise LookupError(f"MCP server {self.spec.name} has no tool {tool!r}")
        facts: dict[str, Any] = {
            **self.spec.public(),
            **self.revision,
            "server_name": self.server_name,
            "tool": tool,
            "annotations": annotations_of(found),
            "task_support": (found.execution.task_support if found.execution else None) or "forbidden",
            "server_tasks": self.server_tasks,
        }
        check = self.spec.status_checks.get(tool)
        if check is not None:
            facts["status_check"] = check.resolved(arguments)
        return facts


def _tool_named(listing: Any, tool: str) -> Any:
    return next((t for t in listing.tools if t.name == tool), None)


def offers_tasks(caps: Any) -> bool:
    """Tasks in the core capabilities (2025-11-25), or the tasks extension (2026-07-28)."""
    extensions = getattr(caps, "extensions", None) or {}
    return bool(getattr(caps, "tasks", None)) or TASKS_EXTENSION in extensions


async def pass_boundary(item_id: int, actor: str, facts: dict[str, Any]) -> None:
    await in_thread(record_and_pass, item_id=item_id, actor=actor, facts=facts)


def record_and_pass(*, item_id: int, actor: str, facts: dict[str, Any]) -> None:
    # One trip to the ledger: the facts first, then the boundary (which raises TaskStopped).
    item_record_detail(item_id=item_id, detail={"mcp": facts}, actor=actor)
    if facts["annotations"]["readOnlyHint"]:
        item_start(item_id=item_id, actor=actor, worker="mcp")
    else:
        # A call that may change the world is an external action: submitted_at marks it.
        item_submit(item_id=item_id, idempotency_key=f"mcp-item-{item_id}", actor=actor, worker="mcp")


async def record_failure(item_id: int, actor: str, exc: BaseException, facts: dict[str, Any] | None) -> None:
    """Whatever broke between registration and the answer, the item says so: a queued item that
    never reached the server failed; a call that was sent and got no answer is unknown unless the
    tool is read-only."""

    if isinstance(exc, Exception):
        exc = unwrap(exc)  # a server's answer wrapped by a transport's task group is still its answer
    error = error_text(exc)
    item = await in_thread(item_state_of, item_id=item_id)
    try:
        if item == ItemState.QUEUED:
            await in_thread(
                item_transition,
                item_id=item_id,
                to_state=ItemState.FAILED,
                actor=actor,
                outcome=f"not sent: {error}"[:200],
                evidence={"error": error, "stage": "before the call"},
            )
            return
        if item != ItemState.RUNNING:
            return
        read_only = bool(facts and facts["annotations"]["readOnlyHint"])
        answered = isinstance(exc, MCPError) and exc.error.code not in NO_ANSWER_CODES
        if read_only or answered:
            await in_thread(
                item_transition,
                item_id=item_id,
                to_state=ItemState.FAILED,
                actor=actor,
                outcome=f"failed: {error}"[:200],
                evidence={"error": error, "stage": "the call", "answered": answered},
            )
            return
        check = (facts or {}).get("status_check")
        why = f"The call was sent and no answer came ({error}); the tool is not read-only, " + (
            f"so the status check ({check['tool']}) will look whether it took effect."
            if check
            else "so whether it took effect is unknown."
        )
        await in_thread(
            item_transition,
            item_id=item_id,
            to_state=ItemState.UNCERTAIN,
            actor=actor,
            outcome="no answer; outcome unknown",
            evidence={"error": error, "stage": "the call", "uncertain_because": why},
            **look_later(facts),
        )
    except IllegalTransition:
        log.info("item %s was settled meanwhile; the error was %s", item_id, error)


# Codes the SDK raises itself when no answer came (connection closed, request timeout).
NO_ANSWER_CODES = frozenset({-32000, -32001})


def error_text(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(error_text(e) for e in exc.exceptions)[:500]
    if isinstance(exc, MCPError):
        return f"MCP error {exc.error.code}: {exc.error.message}"[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


def look_later(facts: dict[str, Any] | None) -> dict[str, Any]:
    """With a status check declared, the reconciler looks at once (and again until its deadline)."""
    from django.utils import timezone

    return {"next_check_at": timezone.now()} if facts and facts.get("status_check") else {}


def unwrap(exc: Exception) -> Exception:
    """The transports' task groups wrap what a call raised; the caller gets the error itself."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
