"""Generic HTTP operations from agent code: an external action sent through the boundary with its
idempotency key, and what is known about it recorded. The declaration (lookup, record and reversal
URLs; see `reconcile.mechanisms.http.adapter`) is stored on the item before the action goes out, so the
adapter can look it up whatever happens to the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import httpx
from django.utils import timezone

from reconcile.mechanisms.base import RecordFact
from reconcile.mechanisms.http.adapter import declaration as declaration_of
from reconcile.mechanisms.http.adapter import record_fact
from reconcile.mechanisms.http.adapter import unsafe_record_id_outcome as unsafe
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.record_ids import record_id_problem
from stopdesk.services.errors import IllegalTransition
from stopdesk.services.items import item_attach_record, item_finish, item_record_detail
from stopdesk.services.transitions import item_submit, item_transition
from stopdesk.states import ItemState


@dataclass(frozen=True)
class Submitted:
    accepted: bool  # the system answered 2xx: the record below exists
    status_code: int | None
    record: RecordFact | None = None
    error: str = ""


def http_submit(
    *,
    item_id: int,
    actor: str,
    idempotency_key: str,
    url: str,
    declaration: dict[str, Any],
    json: Any = None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> Submitted:
    """Pass the boundary with the idempotency key, send the action, and record what is known.

    Accepted: the external record (id and version) is attached and the item completes. A timeout,
    a connection error or a 5xx leaves it `awaiting_reconciliation`, due now: the lookup by key
    will say whether it landed. Raises TaskStopped (nothing sent) once Stop was requested."""

    decl = {**declaration}
    item_record_detail(item_id=item_id, detail={"http": decl}, actor=actor)
    item_submit(item_id=item_id, idempotency_key=idempotency_key, actor=actor)
    cfg = mechanism_settings("http")
    timeout = timeout_s if timeout_s is not None else cfg.call_timeout_s
    response: httpx.Response | None = None
    try:
        with httpx.Client(timeout=timeout) as http:
            response = http.request(
                method, url, json=json, headers={**(headers or {}), "Idempotency-Key": idempotency_key}
            )
        error = "" if response.status_code < 500 else f"HTTP {response.status_code}"
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    if response is not None and response.status_code < 300:
        fact = record_fact(declaration_of({"http": decl}, cfg.options.get("systems", {})), response)
        if (problem := record_id_problem(fact.record_id)) is not None:
            # It happened, but the id cannot be recorded for a later reversal: a person decides.
            item_transition(item_id=item_id, to_state=ItemState.UNCERTAIN, actor=actor, outcome=unsafe(fact, problem))
            return Submitted(True, response.status_code, None, error=problem)
        item_attach_record(item_id=item_id, actor=actor, **dataclasses.asdict(fact))
        item_finish(item_id=item_id, succeeded=True, actor=actor, outcome=f"{fact.effect} {fact.record_id}")
        return Submitted(True, response.status_code, fact)
    if response is not None and response.status_code < 500:
        item_finish(item_id=item_id, succeeded=False, actor=actor, outcome=f"refused: HTTP {response.status_code}")
        return Submitted(False, response.status_code, error=response.text[:200])

    # If reconciliation (after a Stop) looked the action up and settled the item while our call
    # was still waiting, its finding stands, and the agent is told there was no answer.
    with contextlib.suppress(IllegalTransition):
        item_transition(
            item_id=item_id,
            to_state=ItemState.AWAITING_RECONCILIATION,
            actor=actor,
            outcome="sent; no answer",
            message=f"No answer ({error}); looking it up by idempotency key.",
            allowed_from=frozenset({ItemState.RUNNING}),
            next_check_at=timezone.now(),
        )
    return Submitted(False, response.status_code if response is not None else None, error=error)
