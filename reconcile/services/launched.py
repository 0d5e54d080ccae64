"""Tool calls a model response launched itself, recorded as children of the response's item.

A response runs tools while it is active (remote MCP servers called by the provider, code
interpreter, searches) and can leave function calls for the application. Cancelling the response
undoes none of them (mechanisms.md, "Tool calls"), so after the cancel and the read-back each one
found in the output becomes a child item: a read-only call is settled, a call the provider
reports finished is completed or failed, and one it was still running is uncertain with an
investigate-by deadline, in the review queue.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from stopdesk.models import WorkItem
from stopdesk.services.items import item_register
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState, Kind

S = ItemState


def launched_outcome(call: dict[str, Any]) -> tuple[str, str]:
    """The state a launched call is recorded in, and why (pure)."""
    status, error = call.get("status") or "", call.get("error")
    if call.get("type") == "function_call":
        return S.CANCELLED, "left for the application, which never ran it: the task was stopped"
    if error or status == "failed":
        return S.FAILED, f"the provider reports it failed: {error or status}"[:200]
    if status == "completed":
        return S.COMPLETED, "ran on the provider's side while the response was active"
    if call.get("read_only"):
        return S.CANCELLED, f"read-only, {status or 'unfinished'} when the response stopped; nothing to undo"
    return S.UNCERTAIN, f"the provider was still running it ({status or 'no status'}); it may have acted"


def response_launched_record(*, item_id: int, calls: list[dict[str, Any]], actor: str) -> list[int]:
    """Record each call not recorded yet (by call id) under the response's item; returns new ids."""
    created: list[int] = []
    with transaction.atomic():
        # The parent's row lock makes two read-backs of one response record each call once.
        parent = WorkItem.objects.select_for_update().get(pk=item_id)
        known = set(WorkItem.objects.filter(parent_id=item_id).values_list("handle", flat=True))
        for call in calls:
            call_id = call.get("call_id") or ""
            if not call_id or call_id in known:
                continue
            known.add(call_id)
            state, why = launched_outcome(call)
            server = call.get("server_label") or ""
            child = item_register(
                task=parent.task_id,
                parent=parent.pk,
                kind=Kind.REMOTE_TOOL,
                noun="hosted tool call" if call.get("type") != "function_call" else "tool call",
                mechanism="manual",
                handle=call_id,
                label=(f"{server}.{call.get('tool')}" if server else str(call.get("tool")))[:200],
                detail={"launched": call},
                actor=actor,
                observed=True,
            )
            item_transition(
                item_id=child.pk,
                to_state=state,
                actor=actor,
                outcome=why,
                evidence={"launched_by": parent.handle, "status": call.get("status")},
                kind="reconciled",
            )
            created.append(child.pk)
    return created
