"""Tool calls a model response launched itself, recorded as children of the response's item.

A response runs tools while it is active (remote MCP servers called by the provider, code
interpreter, searches) and can leave function calls for the application. Cancelling the response
undoes none of them (the application runs function calls; OpenAI documents no effect on hosted
tools), so after the cancel and the read-back each one found in the output becomes a child item:
a read-only call is settled, a call the provider reports finished is completed or failed, and one
it was still running is uncertain with an investigate-by deadline, in the review queue.
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
    return responses_launched_record(calls={item_id: calls}, actor=actor)[item_id]


def responses_launched_record(*, calls: dict[int, list[dict[str, Any]]], actor: str) -> dict[int, list[int]]:
    """Each response's calls not recorded yet (by call id) under its item, for many responses in
    one transaction (the batched canceller records a whole batch at once): the parents locked in
    one statement, in id order, and the calls already recorded under them read in one query. The
    parents' row locks make two read-backs of one response record each call once. Returns the new
    ids per response."""
    created: dict[int, list[int]] = {item_id: [] for item_id in calls}
    wanted = {item_id: [c for c in item_calls if c.get("call_id")] for item_id, item_calls in calls.items()}
    wanted = {item_id: item_calls for item_id, item_calls in wanted.items() if item_calls}
    if not wanted:
        return created
    with transaction.atomic():
        parents = {p.pk: p for p in WorkItem.objects.select_for_update().filter(pk__in=wanted).order_by("pk")}
        known: set[tuple[int, str]] = set(
            WorkItem.objects.filter(parent_id__in=parents).values_list("parent_id", "handle")
        )
        for item_id in sorted(parents):
            for call in wanted[item_id]:
                if (item_id, call["call_id"]) in known:
                    continue
                known.add((item_id, call["call_id"]))
                created[item_id].append(_child_record(parents[item_id], call, actor))
    return created


def _child_record(parent: WorkItem, call: dict[str, Any], actor: str) -> int:
    """One launched call as a child of `parent`, registered and moved to its state at once."""
    state, why = launched_outcome(call)
    server = call.get("server_label") or ""
    child = item_register(
        task=parent.task_id,
        parent=parent.pk,
        kind=Kind.REMOTE_TOOL,
        noun="hosted tool call" if call.get("type") != "function_call" else "tool call",
        mechanism="manual",
        handle=call["call_id"],
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
    return child.pk
