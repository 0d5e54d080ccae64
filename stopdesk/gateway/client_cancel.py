"""A call the client gave up on: a 2025-11-25 `notifications/cancelled`, or on 2026-07-28 a closed
response stream (which is also what a dropped connection looks like). The gateway then cancels
the upstream call the same way (the SDK does, as the call's scope ends) and the item says so:
cancelled when nothing was sent or the tool is read-only, otherwise uncertain, with the status
check looking where one is declared."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from reconcile.mechanisms.mcp.agent.common import look_later
from stopdesk.gateway.sessions import ACTOR
from stopdesk.models import WorkItem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState

S = ItemState


def record_client_cancel(*, item_id: int) -> None:
    item = WorkItem.objects.get(pk=item_id)
    facts: dict[str, Any] = item.detail.get("mcp") or {}
    if item.state == S.QUEUED:
        _settle(item_id, S.CANCELLED, "the client cancelled it before it was sent", {})
        return
    if item.state != S.RUNNING:
        return  # settled already (the answer came, or a Stop recorded the cancel)
    evidence: dict[str, Any] = {"cancelled_by": "the client", "cancel": {"sent": facts.get("cancel_wire")}}
    if (facts.get("annotations") or {}).get("readOnlyHint"):
        _settle(item_id, S.CANCELLED, "cancelled by the client; read-only tool", evidence)
        return
    check = facts.get("status_check")
    evidence["uncertain_because"] = (
        "The client cancelled the call or its connection dropped, and the gateway cancelled the "
        "upstream call; no answer follows, and the tool is not read-only, "
        + (
            f"so the status check ({check['tool']}) will look whether it took effect."
            if check
            else "so whether it took effect is unknown."
        )
    )
    _settle(item_id, S.UNCERTAIN, "cancelled by the client; no answer follows", evidence, **look_later(facts))


def _settle(item_id: int, to_state: str, outcome: str, evidence: dict[str, Any], **extra: Any) -> None:
    # Settled meanwhile by whoever got there first (the answer, a Stop): their record stands.
    with suppress(IllegalTransition):
        item_transition(
            item_id=item_id,
            to_state=to_state,
            actor=ACTOR,
            outcome=outcome,
            evidence=evidence,
            allowed_from=frozenset({S.QUEUED, S.RUNNING}),
            **extra,
        )
