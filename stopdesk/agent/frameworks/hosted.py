"""Tool calls a model response ran on the provider's side (hosted `mcp_call` items).

No application hook saw them execute (mechanisms.md, "Hosted tools"), so they are recorded from
the response's output items as remote tools under the run's task: completed or failed as the
provider reports, and uncertain (with the review deadline) while the provider still calls them,
because cancelling the response does not undo them.
"""

from __future__ import annotations

from typing import Any

from stopdesk.client.errors import StopRequested

SETTLED_OK = frozenset({"completed"})
SETTLED_FAILED = frozenset({"failed"})


def record_hosted_calls(run: Any, calls: list[dict[str, Any]]) -> None:
    """Queue the records off the caller's path; `run` is the active StopdeskRun."""
    for call in calls:
        run._later(_record(run, call), f"hosted:{call.get('id', '')}")


async def _record(run: Any, call: dict[str, Any]) -> None:
    status = str(call.get("status") or "completed")
    label = f"{call.get('server_label', '')}.{call.get('name', '')}"
    item = await run._call(
        "register",
        run.task_id,
        kind="remote_tool",
        noun="hosted tool call",
        mechanism="manual",
        handle=str(call.get("id", "")),
        label=label[:200],
        detail={
            "hosted": {
                "server_label": call.get("server_label", ""),
                "tool": call.get("name", ""),
                "call_id": call.get("id", ""),
                "status": status,
                "framework": run.framework,
            }
        },
    )
    try:
        await run._call("start", item.id, worker="provider")
    except StopRequested:
        return  # recorded after Stop: the boundary settled it; the adapter's read-back reports the rest
    error = call.get("error")
    if status in SETTLED_OK and not error:
        await run._call("finish", item.id, status="completed", detail=str(call.get("output") or "")[:200])
    elif status in SETTLED_FAILED or error:
        await run._call("finish", item.id, status="failed", detail=str(error or "failed on the provider's side")[:200])
    else:
        await run._call("mark_uncertain", item.id, detail=f"the provider reported it {status}; it may still act")
