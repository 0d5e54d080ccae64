"""Tool calls a model response launched itself, recorded as children of the response's item.

A response runs tools while it is active (remote MCP servers called by the provider, code
interpreter, searches) and can leave function calls for the application. Cancelling the response
undoes none of them (the application runs function calls; OpenAI documents no effect on hosted
tools), so every final read-back records each call found in the output as a child item, and
every later one moves that record with what the provider reports next:

- a read-only call is settled; one the provider still runs is uncertain with an investigate-by
  deadline, in the review queue; a failed one failed, with the error's text;
- a completed call not known to be read-only is an effect: its arguments are kept, it is in the
  review queue (flagged, or by its pending reversal), and it has an external record told by what it did ("send_email": an email sent),
  reversible where it created a record the output names, of a system configured with a reversal;
- each call says when it was first seen: in the output the response had before its cancel took
  hold (`before_cancel`), only after a read-back recorded the response cancelled
  (`after_cancel`: it ran after Stop, is dated from that read-back and flagged), or with no
  cancel asked for (`while_active`); a call that finished only after that read-back is flagged as
  work done after Stop too;
- a function call left for the application after Stop never ran: it is recorded never started.

A later report that contradicts a settled record is a late result (an event and a flag), never an
overwrite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

from django.db import transaction

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.adapter import HttpOperation
from stopdesk.models import WorkItem, pluralize
from stopdesk.record_ids import record_id_problem
from stopdesk.services.items import (
    item_attach_record,
    item_finish,
    item_note_evidence,
    item_record_detail,
    item_register,
)
from stopdesk.services.transitions import item_late_result_record, item_transition
from stopdesk.states import TERMINAL, Effect, ItemState, Kind

S = ItemState

# When a call was first seen, relative to the cancel of the response that launched it.
BEFORE_CANCEL = "before_cancel"
AFTER_CANCEL = "after_cancel"
WHILE_ACTIVE = "while_active"  # no cancel was asked for
NEVER_RAN = "never ran: left for the application, and the task was stopped before it ran it"
AFTER_STOP = "ran after Stop (absent from the read-back that recorded the response cancelled)"
FINISHED_AFTER_STOP = "finished after Stop"
FINAL_STATUSES = frozenset({"completed", "failed", "incomplete"})

# A tool's name says what it did: the first word that is a known verb, the words after it what
# it acted on. A verb that is its own object (`email_customer`) names the object itself.
VERBS: dict[str, tuple[str, str]] = {
    **{verb: (Effect.SENT, "") for verb in ("send", "reply", "forward", "publish")},
    "email": (Effect.SENT, "email"),
    "mail": (Effect.SENT, "email"),
    "notify": (Effect.SENT, "notification"),
    "message": (Effect.SENT, "message"),
    **{verb: (Effect.CREATED, "") for verb in ("create", "add", "insert", "new", "book", "schedule", "upload")},
    **{verb: (Effect.UPDATED, "") for verb in ("update", "edit", "set", "change", "modify", "patch", "rename")},
    **{verb: (Effect.DELETED, "") for verb in ("delete", "remove", "destroy", "drop", "purge", "erase")},
    **{verb: (Effect.ARCHIVED, "") for verb in ("archive",)},
}
DEFAULT_OBJECT: dict[str, str] = {Effect.SENT: "message"}
OBJECT_WORDS = 3


@dataclass(frozen=True)
class LaunchedEffect:
    """What a completed call did in another system, and the record to attach for it."""

    effect: str
    noun: str
    system: str
    record_id: str
    version: str
    reversal: str  # the configured reversal's action, or "" when it cannot be reversed

    def told(self, *, after_stop: bool) -> dict[str, str]:
        """How the summary tells it ("One email sent by a hosted tool", "... after Stop")."""
        by = "a hosted tool after Stop" if after_stop else "a hosted tool"
        return {"noun": self.noun, "nouns": pluralize(self.noun), "by": by}


def launched_outcome(call: dict[str, Any]) -> tuple[str, str]:
    """The state a launched call is recorded in, and why (pure)."""
    status, error = call.get("status") or "", call.get("error")
    if call.get("type") == "function_call":
        return S.CANCELLED, NEVER_RAN
    if error or status == "failed":
        return S.FAILED, f"the provider reports it failed: {error or status}"[:200]
    if status == "completed" and call.get("read_only"):
        return S.COMPLETED, "read-only; ran on the provider's side while the response was active"
    if status == "completed":
        return S.COMPLETED, "ran on the provider's side; not known to be read-only, so it may have changed something"
    if call.get("read_only"):
        return S.CANCELLED, f"read-only, {status or 'unfinished'} when the response stopped; nothing to undo"
    if status == "incomplete":
        return S.UNCERTAIN, "the provider reports it incomplete: it ended partway and may have acted"
    return S.UNCERTAIN, f"the provider was still running it ({status or 'no status'}); it may have acted"


def is_effect(call: dict[str, Any]) -> bool:
    """A completed hosted call not known to be read-only: it may have changed another system."""
    return (
        call.get("type") != "function_call" and not call.get("read_only") and (launched_outcome(call)[0] == S.COMPLETED)
    )


def tool_effect(tool: str) -> tuple[str, str] | None:
    """(effect, what it acted on) as a tool's name says it ("send_email": sent, email), or None
    when no word of it is a known verb (pure)."""
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", tool)]
    for i, word in enumerate(words):
        if word in VERBS:
            effect, own = VERBS[word]
            acted_on = " ".join(words[i + 1 : i + 1 + OBJECT_WORDS])
            return effect, own or acted_on or DEFAULT_OBJECT.get(effect, "record")
    return None


def launched_effect(call: dict[str, Any]) -> LaunchedEffect | None:
    """The effect of an effect call whose tool's name says what it did, with its record: the
    record the output names when its system is configured, else the call itself. Reversible only
    for a record it created, named by the output, of a system that declares a reversal (the
    declared reversals undo a creation: a CRM's archive); never guessed for anything else."""
    said = tool_effect(str(call.get("tool") or "")) if is_effect(call) else None
    if said is None:
        return None
    effect, noun = said
    system = str(call.get("server_label") or call.get("type") or "hosted")[:64]
    declared = cast(HttpOperation, registry.get("http")).declaration({}, system=system)
    named = _named_record(call) if declared.get("base_url") else None
    record_id, version = named or (str(call["call_id"]), "")
    reverse = declared.get("reverse") or {}
    reversible = named is not None and effect == Effect.CREATED and bool(reverse.get("url"))
    return LaunchedEffect(
        effect, noun, system, record_id, version, str(reverse.get("action", "")) if reversible else ""
    )


def _named_record(call: dict[str, Any]) -> tuple[str, str] | None:
    """(record id, version) the call's output named (`launched_tool_calls`), if it is a valid id."""
    named = call.get("record")
    if not isinstance(named, dict) or record_id_problem(str(named.get("id") or "")) is not None:
        return None
    return str(named["id"]), str(named.get("version") or "")


def response_launched_record(*, item_id: int, calls: list[dict[str, Any]], actor: str) -> list[int]:
    """Record each call under the response's item (see `responses_launched_record`); returns the
    ids of the children it created."""
    return responses_launched_record(calls={item_id: calls}, actor=actor)[item_id]


def responses_launched_record(*, calls: dict[int, list[dict[str, Any]]], actor: str) -> dict[int, list[int]]:
    """Each response's calls under its item, for many responses in one transaction (the batched
    canceller records a whole batch at once): the parents locked in one statement, in id order,
    and the calls already recorded under them read in one query. A call not recorded yet becomes
    a child; one recorded before follows what this read-back says of it. The parents' row locks
    make two read-backs of one response record each call once. Returns the new ids per response."""
    created: dict[int, list[int]] = {item_id: [] for item_id in calls}
    wanted = {item_id: [c for c in item_calls if c.get("call_id")] for item_id, item_calls in calls.items()}
    wanted = {item_id: item_calls for item_id, item_calls in wanted.items() if item_calls}
    if not wanted:
        return created
    with transaction.atomic():
        parents = {p.pk: p for p in WorkItem.objects.select_for_update().filter(pk__in=wanted).order_by("pk")}
        known = {
            (child.parent_id, child.handle): child
            for child in WorkItem.objects.filter(parent_id__in=parents).only(
                "id", "parent_id", "handle", "state", "detail"
            )
        }
        for item_id in sorted(parents):
            parent = parents[item_id]
            for call in wanted[item_id]:
                child = known.get((item_id, call["call_id"]))
                if child is not None:
                    _child_follow(parent, child, call, actor)
                elif call.get("type") == "function_call" and parent.cancel_requested_at is None:
                    continue  # the application runs it, through the boundary, as its own item
                else:
                    new = _child_record(parent, call, actor)
                    known[(item_id, call["call_id"])] = new
                    created[item_id].append(new.pk)
    return created


def _when(parent: WorkItem) -> str:
    """When a call found in this read-back of `parent` was launched, relative to its cancel: one
    first seen after a read-back recorded the response cancelled ran after Stop."""
    if parent.cancel_requested_at is None:
        return WHILE_ACTIVE
    read_back = parent.evidence.get("detail") or {}
    cancelled = parent.state == S.CANCELLED and read_back.get("status") == "cancelled"
    return AFTER_CANCEL if cancelled else BEFORE_CANCEL


def _child_record(parent: WorkItem, call: dict[str, Any], actor: str) -> WorkItem:
    """One launched call as a child of `parent`, registered and moved to its state at once."""
    when = _when(parent)
    state, why = launched_outcome(call)
    effect = launched_effect(call)
    server = call.get("server_label") or ""
    function_call = call.get("type") == "function_call"
    after_stop = when == AFTER_CANCEL and not function_call
    detail: dict[str, Any] = {"launched": {**call, "when": when}}
    if effect is not None:
        detail["effect"] = effect.told(after_stop=after_stop)
    child = item_register(
        task=parent.task_id,
        parent=parent.pk,
        kind=Kind.REMOTE_TOOL,
        noun="tool call" if function_call else "hosted tool call",
        mechanism="manual",
        handle=call["call_id"],
        label=(f"{server}.{call.get('tool')}" if server else str(call.get("tool")))[:200],
        detail=detail,
        actor=actor,
        # A function call never ran; a hosted one did, from when the response was active, or for
        # one launched after the cancel, not before the read-back that recorded it cancelled.
        observed=not function_call,
        started_at=parent.finished_at if after_stop else None,
        refused_outcome=NEVER_RAN,
    )
    refused = function_call and child.state == S.CANCELLED  # registered after Stop: never started
    if not refused:
        item_transition(
            item_id=child.pk,
            to_state=state,
            actor=actor,
            outcome=f"{AFTER_STOP}; {why}"[:200] if after_stop else why,
            evidence={"launched_by": parent.handle, "status": call.get("status"), "when": when},
            kind="reconciled",
            needs_review=after_stop or _flagged(call, effect),
        )
    if effect is not None:
        _effect_attach(child.pk, effect, actor)
    return child


def _child_follow(parent: WorkItem, child: WorkItem, call: dict[str, Any], actor: str) -> None:
    """A later read-back of a call already recorded: its latest facts kept (arguments, status,
    error), and its record moved with them. An uncertain call settles; where the recorded outcome
    is final and the provider now says otherwise, the contradiction is a late result (an event
    and a flag), never an overwrite. One that finished only after the response was recorded
    cancelled is flagged as work done after Stop."""
    recorded = dict(child.detail.get("launched") or {})
    if not _final(call) or all(recorded.get(key) == call.get(key) for key in ("status", "error")):
        return  # nothing new, or not an end: a record never goes back to "still running"
    state, why = launched_outcome(call)
    effect = launched_effect(call)
    read_back = _when(parent)
    after_stop = read_back == AFTER_CANCEL
    detail: dict[str, Any] = {"launched": {**call, "when": recorded.get("when", WHILE_ACTIVE)}}
    if effect is not None:
        detail["effect"] = effect.told(after_stop=after_stop)
    item_record_detail(item_id=child.pk, detail=detail, actor=actor)
    if state == child.state:
        if state == S.UNCERTAIN:  # still unknown, but no longer "still running": say what ended it
            ended = {"status": call.get("status"), "why": why, "read_back": read_back}
            item_note_evidence(item_id=child.pk, evidence={"launched_ended": ended}, actor=actor, message=why)
        return
    outcome = f"{FINISHED_AFTER_STOP}: {why}"[:200] if after_stop else why
    evidence = {"launched_by": parent.handle, "status": call.get("status"), "read_back": read_back}
    if child.state in TERMINAL and state in (S.COMPLETED, S.FAILED):
        item_finish(item_id=child.pk, succeeded=state == S.COMPLETED, actor=actor, outcome=outcome, evidence=evidence)
    elif child.state in TERMINAL:
        item_late_result_record(item_id=child.pk, reported=state, actor=actor, outcome=outcome, evidence=evidence)
    elif state != S.UNCERTAIN:
        item_transition(
            item_id=child.pk,
            to_state=state,
            actor=actor,
            outcome=outcome,
            evidence=evidence,
            kind="reconciled",
            needs_review=(after_stop and state == S.COMPLETED) or _flagged(call, effect),
        )
    if effect is not None:
        _effect_attach(child.pk, effect, actor)


def _final(call: dict[str, Any]) -> bool:
    """The provider reports the call ended (completed, failed, incomplete)."""
    return bool(call.get("error")) or call.get("status") in FINAL_STATUSES


def _flagged(call: dict[str, Any], effect: LaunchedEffect | None) -> bool:
    """An effect call goes to review by a flag, unless its record is reversible: then the pending
    reversal puts it there, and deciding the reversal takes it out."""
    return is_effect(call) and not (effect is not None and effect.reversal)


def _effect_attach(item_id: int, effect: LaunchedEffect, actor: str) -> None:
    item_attach_record(
        item_id=item_id,
        system=effect.system,
        record_id=effect.record_id,
        effect=effect.effect,
        actor=actor,
        version=effect.version,
        reversible=bool(effect.reversal),
        reversal=effect.reversal,
    )
