"""MCP tool calls from agent code, through the official `mcp` SDK and the boundary.

`mcp_call_tool` runs a plain call in a cancel scope watched against the ledger and cancels it on
Stop; `mcp_start_task` starts a task-augmented call (protocol 2025-11-25) and stores the task id as
the item's handle. The tasks/* messages are typed by the SDK but not dispatched by it, so the
task-augmented tools/call goes through the session's dispatcher: `send_request` validates every
tools/call answer as a CallToolResult and would reject the CreateTaskResult. The adapter that
cancels and reads these calls back is `reconcile.mechanisms.mcp`.
"""

from __future__ import annotations

from typing import Any, cast

import anyio
import mcp_types as types
from mcp import Client

from reconcile.mechanisms.mcp import connect, describe
from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.handles import item_record_detail, item_record_handle
from stopdesk.agent.aio import in_thread
from stopdesk.services.items import item_finish, item_heartbeat
from stopdesk.services.transitions import item_start, item_submit, item_transition
from stopdesk.states import ItemState


async def _pass_boundary(item_id: int, actor: str, facts: dict[str, Any]) -> None:

    await in_thread(item_record_detail, item_id=item_id, detail={"mcp": facts})
    if facts["annotations"]["readOnlyHint"]:
        await in_thread(item_start, item_id=item_id, actor=actor, worker="mcp")
    else:
        # A call that may change the world is an external action: submitted_at marks it.
        await in_thread(item_submit, item_id=item_id, idempotency_key=f"mcp-item-{item_id}", actor=actor, worker="mcp")


async def mcp_call_tool(
    *,
    item_id: int,
    url: str,
    tool: str,
    arguments: dict[str, Any] | None = None,
    actor: str,
    poll_s: float = 0.5,
    timeout_s: float = 300.0,
) -> types.CallToolResult | None:
    """Record server, tool, protocol version and annotations; pass the boundary; call
    the tool while watching the ledger; cancel the call on Stop. Returns the result, or None when
    the call was cancelled (the item is then recorded cancelled or uncertain)."""

    result: list[types.CallToolResult] = []
    refused: Exception | None = None
    async with connect(url, timeout_s=timeout_s) as client:
        facts = await describe(client, url, tool)
        try:
            await _pass_boundary(item_id, actor, facts)
        except Exception as exc:  # raised after the session closes, not wrapped in its task group
            refused = exc
        stopped = anyio.Event()

        async def call(scope: anyio.CancelScope) -> None:
            # `_meta.stopdesk_item` ties the call to its item at the server (as the OpenAI metadata does).
            result.append(
                await client.call_tool(
                    tool, arguments or {}, meta=cast(types.RequestParamsMeta, {"stopdesk_item": str(item_id)})
                )
            )
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            while True:
                await anyio.sleep(poll_s)
                if await in_thread(item_heartbeat, item_id=item_id):
                    stopped.set()
                    scope.cancel()  # the SDK sends notifications/cancelled for the call
                    return

        if refused is None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, tg.cancel_scope)
                tg.start_soon(watch, tg.cancel_scope)

    if refused is not None:
        raise refused
    if result:
        outcome = result[0]
        text = " ".join(getattr(c, "text", "") for c in outcome.content)[:200]
        await in_thread(
            item_finish, item_id=item_id, succeeded=not outcome.is_error, actor=actor, outcome=text or "done"
        )
        return outcome
    read_only = facts["annotations"]["readOnlyHint"]
    evidence = {"annotations": facts["annotations"], "notification": "notifications/cancelled sent by the SDK"}
    await in_thread(
        item_transition,
        item_id=item_id,
        to_state=ItemState.CANCELLED if read_only else ItemState.UNCERTAIN,
        actor=actor,
        outcome="cancelled; read-only tool"
        if read_only
        else "cancelled call; no answer follows and no status lookup exists",
        evidence=evidence,
        allowed_from=frozenset({ItemState.RUNNING}),
    )
    return None


async def _raw_request(client: Client, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    session = client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {"timeout": timeout_s}
    session._stamp(data, opts)  # type: ignore[arg-type]  # the negotiated version's headers
    return await session._dispatcher.send_raw_request(method, data.get("params"), opts)  # type: ignore[arg-type]


async def _start_task(
    url: str, tool: str, arguments: dict[str, Any], ttl_ms: int | None, item_id: int, actor: str, timeout_s: float
) -> tuple[str, dict[str, Any]]:
    async with connect(url, timeout_s=timeout_s) as client:
        facts = await describe(client, url, tool)
        if not facts["server_tasks"] or facts["task_support"] not in ("optional", "required"):
            raise ValueError(f"{tool!r} on {url} cannot run as a task")
        try:
            await _pass_boundary(item_id, actor, facts)
        except Exception as exc:  # raised after the session closes, not wrapped in its task group
            return "", {"refused": exc}
        params: dict[str, Any] = {
            "name": tool,
            "arguments": arguments,
            "task": {} if ttl_ms is None else {"ttl": ttl_ms},
            "_meta": {"stopdesk_item": str(item_id)},
        }
        answer = await _raw_request(client, "tools/call", params, timeout_s)
        task = types.CreateTaskResult.model_validate(answer, by_name=False).task
        return task.task_id, {**facts, "task_status": task.status, "ttl_ms": task.ttl}


def mcp_start_task(
    *, item_id: int, url: str, tool: str, arguments: dict[str, Any] | None = None, actor: str, ttl_ms: int | None = None
) -> str:
    """Start a task-augmented tool call and store the task id as the item's handle
    before anything else. Returns the task id. Raises TaskStopped if Stop came first."""

    timeout = mechanism_settings("mcp").call_timeout_s
    task_id, facts = anyio.run(_start_task, url, tool, arguments or {}, ttl_ms, item_id, actor, timeout)
    if "refused" in facts:
        raise facts["refused"]
    item_record_handle(item_id=item_id, handle=task_id, actor=actor, detail={"mcp": facts})
    return task_id
