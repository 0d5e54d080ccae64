"""Tool calls a model response ran on the provider's side (hosted `mcp_call` items, code
interpreter, searches).

No application hook saw them execute, and cancelling the response does not undo them (OpenAI's
Responses API documents no effect of a cancel on hosted tools), so they are recorded from the
response's output items as children of the model request's item, however the run ends: an
answer the boundary discards after Stop still had its calls run. In-process and over HTTP the
records go through the same service as the OpenAI adapter's read-back after a cancel
(`record_launched`), keyed by call id under the response's item, so a call seen twice (a
streamed item, then the completed response; a read-back) is recorded once: completed or failed
as the provider reports, settled if read-only, otherwise uncertain with the review deadline,
from when the request went out (not when it was found). A call seen again with another status
is sent again, and its record follows it; a completed call not known read-only is an effect
(arguments kept, an external record, flagged for review).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from reconcile.mechanisms.openai.adapter import launched_tool_calls
from stopdesk.protocol.errors import StopRequested

# Run by the provider, not by the application (function calls are the framework's own tool calls).
HOSTED_TYPES = frozenset(
    {"mcp_call", "code_interpreter_call", "web_search_call", "file_search_call", "tool_search_call"}
)
SETTLED_OK = frozenset({"completed"})
SETTLED_FAILED = frozenset({"failed"})
_seen: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_registered: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()  # by `_record_one`


def hosted_calls(output: list[Any]) -> list[dict[str, Any]]:
    """The provider-run tool calls among a response's output items, as plain facts."""
    items = [item.model_dump() if hasattr(item, "model_dump") else dict(item) for item in output]
    return [c for c in launched_tool_calls({"output": items}) if c["type"] in HOSTED_TYPES and c["call_id"]]


def record_hosted_calls(run: Any, output: list[Any], draft: asyncio.Future[Any] | None = None) -> None:
    """Queue the records off the caller's path; `run` is the active StopdeskRun and `draft` the
    model request's item id to come (`StopdeskRun.model_request`)."""
    seen = _seen.setdefault(run, set())
    # By call id and status: the same call reported again as it ended is news for its record.
    calls = [c for c in hosted_calls(output) if (c["call_id"], c["status"]) not in seen]
    if not calls:
        return
    seen.update((c["call_id"], c["status"]) for c in calls)
    run._later(_record(run, calls, draft), f"hosted:{calls[0]['call_id']}")


async def _record(run: Any, calls: list[dict[str, Any]], draft: asyncio.Future[Any] | None) -> None:
    parent = await run.draft_id(draft) if draft is not None else None
    if parent is not None and hasattr(run.runtime, "record_launched"):
        await run._call("record_launched", parent, calls)
        return
    registered = _registered.setdefault(run, set())
    for call in calls:
        # Plain item calls cannot move a settled record: each call is registered once.
        if call["call_id"] not in registered:
            registered.add(call["call_id"])
            await _record_one(run, call, parent)


async def _record_one(run: Any, call: dict[str, Any], parent: int | None) -> None:
    """A runtime without `record_launched` (a runtime of one's own): register and report through the
    plain item calls. After Stop the boundary refuses the start, so such a call is recorded
    cancelled with the stop; `record_launched` is the one that keeps it uncertain."""
    status = call["status"] or "completed"
    label = f"{call['server_label']}.{call['tool']}" if call["server_label"] else call["tool"]
    item = await run._call(
        "register",
        run.task_id,
        kind="remote_tool",
        noun="hosted tool call",
        mechanism="manual",
        handle=call["call_id"],
        label=label[:200],
        parent=parent,
        detail={"launched": call, "hosted": {"framework": run.framework}},
    )
    try:
        await run._call("start", item.id, worker="provider")
    except StopRequested:
        return
    error = call.get("error")
    if status in SETTLED_OK and not error:
        await run._call("finish", item.id, status="completed", detail="ran on the provider's side")
    elif status in SETTLED_FAILED or error:
        await run._call("finish", item.id, status="failed", detail=str(error or "failed on the provider's side")[:200])
    else:
        await run._call("mark_uncertain", item.id, detail=f"the provider reported it {status}; it may still act")
