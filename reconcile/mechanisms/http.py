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
from stopdesk.record_ids import UnsafeRecordId, path_segment, read_back_problem, record_id_problem

RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


def declaration(detail: dict[str, Any], systems: dict[str, Any], system: str | None = None) -> dict[str, Any]:
    """The item's declaration over its system's configured one: the item's keys win."""
    declared = dict(detail.get("http") or {})
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


def unsafe_record_id_outcome(fact: RecordFact, problem: str) -> str:
    return f"{fact.system} answered with record id {fact.record_id[:60]!r}, which {problem}; review it by hand"[:200]


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
        """Per item, what the operation's declaration (on the item, or its system's) provides."""
        if item is None:
            return capability in self.capabilities
        decl = self.declaration(item.detail)
        if capability == Capability.CANCEL:
            return bool(decl.get("cancel_url"))
        if capability == Capability.INSPECT:
            return bool(decl.get("lookup_url"))
        return bool((decl.get("reverse") or {}).get("url"))

    def declaration(self, detail: dict[str, Any], system: str | None = None) -> dict[str, Any]:
        return declaration(detail, self.settings.options.get("systems", {}), system)

    def _http(self) -> httpx.Client:
        return httpx.Client(timeout=self.settings.call_timeout_s)

    def cancel(self, item: ItemRef) -> Observation:
        decl = self.declaration(item.detail)
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
        decl = self.declaration(item.detail)
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
            return Observation(
                Seen.UNKNOWABLE, remote_status="unsafe record id", message=unsafe_record_id_outcome(fact, problem)
            )
        body = response.json()
        failed = str(body.get("status", "")).lower() in ("failed", "error", "rejected")
        return Observation(
            Seen.FAILED if failed else Seen.COMPLETED,
            remote_status=str(body.get("status", f"HTTP {response.status_code}")),
            detail={"record_id": fact.record_id, "version": fact.version},
            record=None if failed else fact,
        )

    # Compensation: read the current version, reverse with it as precondition.

    def read_version(self, record: Any, *, timeout_s: float | None = None) -> VersionRead:
        """GET the external record and report its current version. Never raises for remote failures."""
        item = getattr(record, "item", None)
        decl = self.declaration(item.detail if item is not None else {}, system=record.system)
        url = decl.get("record_url")
        if not url:
            return VersionRead(False, error=f"no record_url declared for system {record.system!r}")
        try:
            with httpx.Client(timeout=timeout_s or self.settings.call_timeout_s) as http:
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

    def reverse(
        self, record: Any, expected_version: str, *, actor: str = "stopdesk", timeout_s: float | None = None
    ) -> Reversal:
        """Run the declared reversal with `expected_version` as If-Match. A changed record is a
        `version_mismatch` (HTTP 412), never forced. Idempotent where the system replays a repeat."""
        item = getattr(record, "item", None)
        decl = self.declaration(item.detail if item is not None else {}, system=record.system)
        spec = decl.get("reverse") or {}
        if not spec.get("url"):
            return Reversal("not_reversible", error=f"no reversal declared for system {record.system!r}")
        if not expected_version:
            return Reversal("error", error="a reversal needs the version it expects")
        try:
            with httpx.Client(timeout=timeout_s or self.settings.call_timeout_s) as http:
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
