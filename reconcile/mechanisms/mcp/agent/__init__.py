"""The agent's side of MCP: calls and tasks that pass the boundary, watch the ledger for Stop, and
record how they ended.

`mcp_call_tool` makes a plain call over Streamable HTTP or stdio, in the newest revision the
server offers (2026-07-28, else 2025-11-25). On Stop it cancels the call's scope, and the SDK
cancels the way that revision means it: `notifications/cancelled` on stdio, the same with the
request id as its own POST on 2025-11-25 HTTP, closing the response stream on 2026-07-28 HTTP;
no answer follows, so a read-only tool ends
`cancelled` and any other tool `uncertain` (with a status check declared, the reconciler then
looks). It keeps the session open for `after_cancel_s` after a cancel: a stdio server is not
killed in the middle of the work it may still be doing, and progress the server keeps reporting
is recorded as evidence. Any failure after registration is recorded on the item with its error.

`mcp_run_task` / `mcp_start_task` make a task call (the 2026-07-28 tasks extension, or 2025-11-25
core tasks) and own it until the task is final or Stop has been reconciled. In 2025-11-25 servers
keep tasks per session, so the cancel (`tasks/cancel`) and the read-back (`tasks/get`) go through
the session that created it; in 2026-07-28 they name the task by its id. The owner is the
agent process; it holds the item's lease while it lives. If it dies, the reconciler resumes the
session by its id where the server still has it, or records the task uncertain because its
session's owner stopped.
"""

from reconcile.mechanisms.mcp.agent.calls import ProgressSeen, StopPushed, call_passed, listening, mcp_call_tool
from reconcile.mechanisms.mcp.agent.common import ServerRef, describe
from reconcile.mechanisms.mcp.agent.tasks import TaskOwner, mcp_run_task, mcp_start_task, task_owner

__all__ = [
    "ProgressSeen",
    "ServerRef",
    "StopPushed",
    "TaskOwner",
    "call_passed",
    "describe",
    "listening",
    "mcp_call_tool",
    "mcp_run_task",
    "mcp_start_task",
    "task_owner",
]
