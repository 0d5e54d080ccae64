"""Recording the work stopped responses launched, as the batched canceller does (one transaction).

launched.record_ms          60 stopped drafts' 300 launched calls recorded as children (the
                            issue's mix per response: a search completed, an email sent, a record
                            still being created, a delete failed, a function call never run)
launched.record_ms_per_call that, per call
launched.follow_ms          the next read-back of the same 60 responses, every unfinished call
                            now completed (records moved, effects attached)
launched.repeat_ms          the same read-back again: nothing new, nothing written

`BENCH=launched make bench`. No provider is called: the read-backs' calls are given, as the
adapter would list them, so the figures are the ledger's cost alone.
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import Figure

DRAFTS = 60
# A read-back that brings nothing new must cost next to nothing: the flip watch repeats it.
REPEAT_TARGET_MS = 100.0


def _calls(n: int, *, ended: bool) -> list[dict[str, Any]]:
    """One response's launched calls, as `launched_tool_calls` lists them."""

    def call(kind: str, label: str, tool: str, status: str, **more: Any) -> dict[str, Any]:
        return {"type": kind, "server_label": label, "tool": tool, "call_id": f"{tool}_{n}", "status": status, **more}

    return [
        call("web_search_call", "", "web_search_call", "completed", read_only=True, arguments={"q": "acme"}),
        call("mcp_call", "crm", "send_email", "completed", arguments={"to": "ceo@acme.example"}),
        call("mcp_call", "crm", "create_record", "completed" if ended else "calling", record={"id": f"acc-{n}"}),
        call("mcp_call", "crm", "delete_record", "failed", error="forbidden"),
        call("function_call", "", "send_invoice", "completed", arguments={"to": "acme"}),
    ]


def run() -> list[Figure]:
    from reconcile.services.launched import responses_launched_record
    from stopdesk.services.items import item_register, item_set_handle, task_create
    from stopdesk.services.stop import task_request_stop
    from stopdesk.services.transitions import item_start
    from stopdesk.states import Kind

    task = task_create(title="launched bench", actor="bench")
    drafts = []
    for n in range(DRAFTS):
        item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="bench", mechanism="openai")
        item_start(item_id=item.pk, actor="bench")
        item_set_handle(item_id=item.pk, handle=f"resp_{n}", actor="bench")
        drafts.append(item.pk)
    task_request_stop(task_id=task.pk, actor="bench", dispatch=lambda ids: None)

    def timed(ended: bool) -> float:
        started = time.perf_counter()
        responses_launched_record(calls={d: _calls(n, ended=ended) for n, d in enumerate(drafts)}, actor="bench")
        return (time.perf_counter() - started) * 1000

    record_ms = timed(ended=False)
    follow_ms = timed(ended=True)
    repeat_ms = timed(ended=True)
    calls = DRAFTS * len(_calls(0, ended=False))
    return [
        Figure("launched.record_ms", record_ms, "ms"),
        Figure("launched.record_ms_per_call", record_ms / calls, "ms"),
        Figure("launched.follow_ms", follow_ms, "ms"),
        Figure("launched.repeat_ms", repeat_ms, "ms", REPEAT_TARGET_MS),
    ]
