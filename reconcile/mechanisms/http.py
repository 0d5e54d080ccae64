"""Generic HTTP operations (httpx): an external action declared with an idempotency key, a status
lookup, an optional cancel endpoint and an optional reversal.

The declaration lives on the item (`detail["http"]`), written before the action is submitted:

    {"system": "crm", "effect": "created",
     "lookup_url": "http://crm/records?idempotency_key={idempotency_key}",
     "record_url": "http://crm/records/{record_id}",               # read_version()
     "cancel_url": "http://crm/ops/{idempotency_key}/cancel",       # optional
     "reverse": {"action": "archive", "url": "http://crm/records/{record_id}/archive"},  # optional
     "id_field": "id", "version_field": "version"}

Systems may also be declared once in settings, STOPDESK_MECHANISMS["http"]["options"]["systems"]
[name], with the same keys; the item's declaration wins.

For compensation (run only after approval, by the compensation workflow): `read_version(record)`
and `reverse(record, expected_version)`, which sends the version as If-Match and never forces.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import httpx

from reconcile.mechanisms.base import (
    Capability,
    ItemRef,
    Mechanism,
    MechanismSettings,
    Observation,
    RecordFact,
    Seen,
)
from reconcile.mechanisms.registry import register
from stopdesk.record_ids import UnsafeRecordId, path_segment, read_back_problem, record_id_problem

RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


def _declaration(detail: dict[str, Any], system: str | None = None) -> dict[str, Any]:
    from reconcile.mechanisms.registry import mechanism_settings

    declared = dict(detail.get("http") or {})
    systems = mechanism_settings("http").options.get("systems", {})
    return {**systems.get(system or declared.get("system", ""), {}), **declared}


def _fill(template: str, **values: str) -> str:
    """Each value becomes one percent-encoded path segment (never `..`, never a `/`): ids are data.
    Raises UnsafeRecordId for a value that cannot be one."""
    return template.format(**{k: path_segment(v) for k, v in values.items()})


def _version_of(response: httpx.Response, body: dict[str, Any], field_name: str) -> str:
    if body.get(field_name) is not None:
        return str(body[field_name])
    return response.headers.get("etag", "")


def _if_match(version: str) -> str:
    if version.startswith(('"', "W/")) or version == "*":
        return version
    return f'"{version}"'


def record_fact(decl: dict[str, Any], response: httpx.Response) -> RecordFact:
    body = response.json()
    record_id = str(body[decl.get("id_field", "id")])
    reverse = decl.get("reverse") or {}
    link = decl.get("record_url", "")
    return RecordFact(
        system=decl.get("system", "http"),
        record_id=record_id,
        version=_version_of(response, body, decl.get("version_field", "version")),
        effect=decl.get("effect", "created"),
        reversible=bool(reverse),
        reversal=reverse.get("action", ""),
        link=_link(link, record_id),
    )


def _link(template: str, record_id: str) -> str:
    # An unsafe id gets no link; recording it is refused by the ledger with the reason.
    try:
        return _fill(template, record_id=record_id) if template else ""
    except UnsafeRecordId:
        return ""


@register
class HttpOperation(Mechanism):
    name = "http"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT, Capability.REVERSE})
    defaults = MechanismSettings(
        call_timeout_s=10.0,
        deadline_s=600.0,
        backoff_initial_s=2.0,
        backoff_max_s=60.0,
        recheck_interval_s=5.0,
        # An action we found no trace of may still land (a server that finishes a request its
        # client gave up on); a late landing then becomes a late result for review.
        recheck_after_cancelled_s=300.0,
    )

    def can(self, capability: Capability, item: ItemRef | None = None) -> bool:
        if item is None or capability != Capability.CANCEL:
            return capability in self.capabilities
        return bool(_declaration(item.detail).get("cancel_url"))

    def _http(self) -> httpx.Client:
        return httpx.Client(timeout=self.settings.call_timeout_s)

    def cancel(self, item: ItemRef) -> Observation:
        decl = _declaration(item.detail)
        url = decl.get("cancel_url")
        if not url:
            return self.inspect(item)
        try:
            with self._http() as http:
                answer = http.post(
                    _fill(url, idempotency_key=item.idempotency_key), headers={"Idempotency-Key": item.idempotency_key}
                )
            cancel = f"HTTP {answer.status_code}"
            answered = answer.status_code < 500
        except UnsafeRecordId as exc:
            cancel, answered = str(exc), False
        except httpx.HTTPError as exc:
            cancel, answered = type(exc).__name__, False
        read_back = self.inspect(item)
        detail = {**read_back.detail, "cancel": cancel}
        if read_back.seen in (Seen.RUNNING, Seen.NO_EFFECT) and not answered:
            return Observation(Seen.UNREACHABLE, remote_status=f"cancel {cancel}", detail=detail)
        return Observation(
            read_back.seen, read_back.remote_status, read_back.message, detail, read_back.record, cancel_sent=answered
        )

    def inspect(self, item: ItemRef) -> Observation:
        decl = _declaration(item.detail)
        url = decl.get("lookup_url")
        if not url or not item.idempotency_key:
            return Observation(Seen.UNKNOWABLE, remote_status="no lookup", message="No status lookup was declared.")
        try:
            with self._http() as http:
                response = http.get(_fill(url, idempotency_key=item.idempotency_key))
        except UnsafeRecordId as exc:
            return Observation(Seen.UNKNOWABLE, remote_status="unsafe key", message=str(exc))
        except httpx.HTTPError as exc:
            return Observation(Seen.UNREACHABLE, remote_status=type(exc).__name__)
        if response.status_code == 404:
            return Observation(
                Seen.NO_EFFECT,
                remote_status="HTTP 404",
                message=f"{decl.get('system', 'the system')} has no trace of it",
                detail={"lookup": "not found"},
            )
        if response.status_code in RETRYABLE_STATUS:
            return Observation(Seen.UNREACHABLE, remote_status=f"HTTP {response.status_code}")
        if response.status_code >= 400:
            return Observation(
                Seen.UNKNOWABLE, remote_status=f"HTTP {response.status_code}", message=response.text[:200]
            )
        fact = record_fact(decl, response)
        if (problem := record_id_problem(fact.record_id)) is not None:
            return Observation(Seen.UNKNOWABLE, remote_status="unsafe record id", message=_unsafe(fact, problem))
        body = response.json()
        failed = str(body.get("status", "")).lower() in ("failed", "error", "rejected")
        return Observation(
            Seen.FAILED if failed else Seen.COMPLETED,
            remote_status=str(body.get("status", f"HTTP {response.status_code}")),
            detail={"record_id": fact.record_id, "version": fact.version},
            record=None if failed else fact,
        )


# --- agent side --------------------------------------------------------------------------------


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
    from reconcile.mechanisms.registry import mechanism_settings
    from reconcile.services.handles import item_attach_fact, item_record_detail
    from stopdesk.services.boundary import item_submit
    from stopdesk.services.items import item_finish, item_transition
    from stopdesk.states import ItemState

    decl = {**declaration}
    item_record_detail(item_id=item_id, detail={"http": decl})
    item_submit(item_id=item_id, idempotency_key=idempotency_key, actor=actor)
    timeout = timeout_s if timeout_s is not None else mechanism_settings("http").call_timeout_s
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
        fact = record_fact(_declaration({"http": decl}), response)
        if (problem := record_id_problem(fact.record_id)) is not None:
            # It happened, but the id cannot be recorded for a later reversal: a person decides.
            item_transition(item_id=item_id, to_state=ItemState.UNCERTAIN, actor=actor, outcome=_unsafe(fact, problem))
            return Submitted(True, response.status_code, None, error=problem)
        item_attach_fact(item_id=item_id, fact=fact, actor=actor)
        item_finish(item_id=item_id, succeeded=True, actor=actor, outcome=f"{fact.effect} {fact.record_id}")
        return Submitted(True, response.status_code, fact)
    if response is not None and response.status_code < 500:
        item_finish(item_id=item_id, succeeded=False, actor=actor, outcome=f"refused: HTTP {response.status_code}")
        return Submitted(False, response.status_code, error=response.text[:200])
    from django.utils import timezone

    from stopdesk.services.errors import IllegalTransition

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


def _unsafe(fact: RecordFact, problem: str) -> str:
    return f"{fact.system} answered with record id {fact.record_id[:60]!r}, which {problem}; review it by hand"[:200]


# --- compensation: read the current version, reverse with it as precondition ------------------


@dataclass(frozen=True)
class VersionRead:
    ok: bool
    version: str = ""
    status: str = ""  # the record's own status ("active", "archived"), when it says
    status_code: int | None = None
    error: str = ""
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reversal:
    outcome: str  # "done", "version_mismatch", "not_found", "not_reversible", "error"
    status_code: int | None = None
    current_version: str = ""  # on a mismatch: what the record is at now
    new_version: str = ""  # when done: the version after the reversal
    error: str = ""
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.outcome == "done"


def _record_decl(record: Any) -> dict[str, Any]:
    item = getattr(record, "item", None)
    return _declaration(item.detail if item is not None else {}, system=record.system)


def read_version(record: Any, *, timeout_s: float | None = None) -> VersionRead:
    """GET the external record and report its current version. Never raises for remote failures."""
    decl = _record_decl(record)
    url = decl.get("record_url")
    if not url:
        return VersionRead(False, error=f"no record_url declared for system {record.system!r}")
    try:
        with httpx.Client(timeout=timeout_s or HttpOperation.defaults.call_timeout_s) as http:
            response = http.get(_fill(url, record_id=record.record_id))
    except UnsafeRecordId as exc:
        return VersionRead(False, error=str(exc))
    except httpx.HTTPError as exc:
        return VersionRead(False, error=type(exc).__name__)
    if response.status_code >= 300:
        return VersionRead(False, status_code=response.status_code, error=response.text[:200])
    body = response.json()
    if (problem := read_back_problem(record.record_id, body, decl.get("id_field", "id"))) is not None:
        return VersionRead(False, status_code=response.status_code, error=problem, body=body)
    version = _version_of(response, body, decl.get("version_field", "version"))
    return VersionRead(True, version, str(body.get("status", "")), response.status_code, body=body)


def reverse(record: Any, expected_version: str, *, actor: str = "stopdesk", timeout_s: float | None = None) -> Reversal:
    """Run the declared reversal with `expected_version` as If-Match. A changed record is a
    `version_mismatch` (HTTP 412), never forced. Idempotent where the system replays a repeat."""
    decl = _record_decl(record)
    spec = decl.get("reverse") or {}
    if not spec.get("url"):
        return Reversal("not_reversible", error=f"no reversal declared for system {record.system!r}")
    if not expected_version:
        return Reversal("error", error="a reversal needs the version it expects")
    try:
        with httpx.Client(timeout=timeout_s or HttpOperation.defaults.call_timeout_s) as http:
            response = http.request(
                spec.get("method", "POST"),
                _fill(spec["url"], record_id=record.record_id),
                headers={"If-Match": _if_match(expected_version), "X-Actor": actor},
            )
    except UnsafeRecordId as exc:
        return Reversal("error", error=str(exc))
    except httpx.HTTPError as exc:
        return Reversal("error", error=type(exc).__name__)
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    field_name = decl.get("version_field", "version")
    if response.status_code == 412:
        current = str(body.get(field_name, "")) or response.headers.get("etag", "")
        return Reversal("version_mismatch", 412, current_version=current, body=body)
    if response.status_code == 404:
        return Reversal("not_found", 404, body=body)
    if response.status_code >= 300:
        return Reversal("error", response.status_code, error=response.text[:200], body=body)
    return Reversal("done", response.status_code, new_version=_version_of(response, body, field_name), body=body)
