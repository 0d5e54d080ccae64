"""Generic HTTP operations (httpx): an external action declared with an idempotency key, a status
lookup, an optional cancel endpoint and an optional reversal.

Every URL the adapter calls comes from configuration: a system is declared once in settings,
STOPDESK_MECHANISMS["http"]["options"]["systems"][name]:

    {"base_url": "https://crm.example",
     "lookup_url": "/records?idempotency_key={idempotency_key}",
     "record_url": "/records/{record_id}",                          # read_version()
     "cancel_url": "/ops/{idempotency_key}/cancel",                 # optional
     "reverse": {"action": "archive", "url": "/records/{record_id}/archive",  # optional
                 "label": "Archive the record", "if_match": '"v{version}"'},
     "id_field": "id", "version_field": "version"}

URLs starting with "/" are joined to `base_url`. An item only *names* its system and its effect
(`detail["http"] = {"system": "crm", "effect": "created"}`, written before the action is
submitted); the ids filled into the templates (idempotency key, record id) are each one
percent-encoded path segment, so they can never add a segment, a query or a host. An item that
names a system nobody configured has no lookup, no cancel and no reversal: it is settled by a
person. `reverse.if_match` is how the system wants its version back in If-Match (default: the
version, quoted as an ETag).

For compensation (run only after approval, by the compensation workflow): `read_version(record)`
and `reverse(record, expected_version)`, which sends the version as If-Match and never forces;
`reversal_request(record)` is the request `reverse` would send, for people to see before they
approve it.
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
    """The configured declaration of the system the item names (or `system`, a record's). Of the
    item's own declaration only the system's name and the effect count: any URL, header or
    reversal an item carries (a row written before such overrides were refused) is never used."""
    declared = detail.get("http") or {}
    declared = declared if isinstance(declared, dict) else {}
    name = str(system or declared.get("system") or "")
    effect = {"effect": str(declared["effect"])} if isinstance(declared.get("effect"), str) else {}
    return {**(systems.get(name) or {}), **effect, "system": name} if name else effect


def _fill(template: str, base_url: str = "", **values: str) -> str:
    """Each value becomes one percent-encoded path segment (never `..`, never a `/`): ids are data.
    A template starting with "/" is joined to the system's `base_url`. Raises UnsafeRecordId for a
    value that cannot be one."""
    filled = template.format(**{k: path_segment(v) for k, v in values.items()})
    return base_url.rstrip("/") + filled if filled.startswith("/") and base_url else filled


def _version_of(response: httpx.Response, body: dict[str, Any], field_name: str) -> str:
    if body.get(field_name) is not None:
        return str(body[field_name])
    return response.headers.get("etag", "")


def _if_match(version: str, template: str = "") -> str:
    if version.startswith(('"', "W/")) or version == "*":
        return version
    return template.format(version=version) if template else f'"{version}"'


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
        link=_link(link, record_id, decl.get("base_url", "")),
    )


def _link(template: str, record_id: str, base_url: str = "") -> str:
    # An unsafe id gets no link; recording it is refused by the ledger with the reason.
    try:
        return _fill(template, base_url, record_id=record_id) if template else ""
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
    request: str = ""  # what was sent: "POST https://crm.example/records/acc-10/archive"

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
        """Per item, what the configured system the item names provides."""
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
                    _fill(url, decl.get("base_url", ""), idempotency_key=item.idempotency_key),
                    headers={"Idempotency-Key": item.idempotency_key},
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
                response = http.get(_fill(url, decl.get("base_url", ""), idempotency_key=item.idempotency_key))
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
        try:
            fact = record_fact(decl, response)
        except (KeyError, TypeError, ValueError):  # not JSON, not an object, or no id in it
            return Observation(
                Seen.UNKNOWABLE,
                remote_status="unreadable answer",
                message=f"The lookup answered without a record id: {response.text[:160]}",
            )
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
        decl = self.declaration({}, system=record.system)
        url = decl.get("record_url")
        if not url:
            return VersionRead(False, error=f"no record_url configured for system {record.system!r}")
        try:
            with httpx.Client(timeout=timeout_s or self.settings.call_timeout_s) as http:
                response = http.get(_fill(url, decl.get("base_url", ""), record_id=record.record_id))
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

    def reversal_request(self, record: Any) -> tuple[str, str] | None:
        """The method and URL `reverse` sends for `record`: the configured system's template with
        the recorded record id. None when the system offers no reversal or the id cannot be one
        path segment."""
        decl = self.declaration({}, system=record.system)
        spec = decl.get("reverse") or {}
        if not spec.get("url"):
            return None
        try:
            return str(spec.get("method", "POST")).upper(), _fill(
                spec["url"], decl.get("base_url", ""), record_id=record.record_id
            )
        except UnsafeRecordId:
            return None

    def reverse(
        self, record: Any, expected_version: str, *, actor: str = "stopdesk", timeout_s: float | None = None
    ) -> Reversal:
        """Run the declared reversal with `expected_version` as If-Match. A changed record is a
        `version_mismatch` (HTTP 412), never forced. Idempotent where the system replays a repeat."""
        decl = self.declaration({}, system=record.system)
        spec = decl.get("reverse") or {}
        if not spec.get("url"):
            return Reversal("not_reversible", error=f"no reversal configured for system {record.system!r}")
        if not expected_version:
            return Reversal("error", error="a reversal needs the version it expects")
        try:
            method, url = (
                spec.get("method", "POST").upper(),
                _fill(spec["url"], decl.get("base_url", ""), record_id=record.record_id),
            )
        except UnsafeRecordId as exc:
            return Reversal("error", error=str(exc))
        sent = f"{method} {url}"
        try:
            with httpx.Client(timeout=timeout_s or self.settings.call_timeout_s) as http:
                response = http.request(
                    method,
                    url,
                    headers={"If-Match": _if_match(expected_version, spec.get("if_match", "")), "X-Actor": actor},
                )
        except httpx.HTTPError as exc:
            return Reversal("error", error=type(exc).__name__, request=sent)
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        field_name = decl.get("version_field", "version")
        if response.status_code == 412:
            current = str(body.get(field_name, "")) or response.headers.get("etag", "")
            return Reversal("version_mismatch", 412, current_version=current, body=body, request=sent)
        if response.status_code == 404:
            return Reversal("not_found", 404, body=body, request=sent)
        if response.status_code >= 300:
            return Reversal("error", response.status_code, error=response.text[:200], body=body, request=sent)
        return Reversal(
            "done", response.status_code, new_version=_version_of(response, body, field_name), body=body, request=sent
        )


ADAPTER = HttpOperation
