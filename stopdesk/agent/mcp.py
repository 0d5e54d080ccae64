"""MCP calls and tasks, where agent code is documented to find them; they live with their
mechanism (reconcile/mechanisms/mcp/agent/)."""

from reconcile.mechanisms.mcp.agent import (
    ServerRef,
    TaskOwner,
    describe,
    mcp_call_tool,
    mcp_run_task,
    mcp_start_task,
    task_owner,
)

__all__ = ["ServerRef", "TaskOwner", "describe", "mcp_call_tool", "mcp_run_task", "mcp_start_task", "task_owner"]
