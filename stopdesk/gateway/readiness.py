"""Readiness `enforce`, at the gateway: a tool whose stop path cannot account for its work is left
out of `tools/list` and refused at `tools/call`, with the reason (the agent's tool set narrowed
until it can). Judged as the readiness page judges an MCP call: by the upstream's annotations, a
status check configured for the tool, and the latest drill (`reconcile.readiness.verdict_for`)."""

from __future__ import annotations

import mcp_types as types

from reconcile.mechanisms.mcp.adapter import annotations_of
from reconcile.readiness import NOT_READY, policy, verdict_for
from stopdesk.states import Kind


def enforced() -> bool:
    return policy() == "enforce"


def not_ready_because(upstream: str, tool: types.Tool) -> str | None:
    """Why the tool is not ready, or None when it may be called."""
    detail = {"mcp": {"server": upstream, "tool": tool.name, "annotations": annotations_of(tool)}}
    verdict = verdict_for("mcp", kind=Kind.REMOTE_TOOL, detail=detail, tool=f"mcp:{upstream}/{tool.name}")
    if verdict.status != NOT_READY:
        return None
    return f"tool {tool.name!r} is not ready (readiness policy enforce): {'; '.join(verdict.missing)}"


def ready_tools(upstream: str, tools: list[types.Tool]) -> list[types.Tool]:
    return [tool for tool in tools if not_ready_because(upstream, tool) is None]
