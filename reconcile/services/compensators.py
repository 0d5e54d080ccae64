"""How a compensation reads and reverses a record in another system.

A small interface of our own, keyed by `ExternalRecord.system`, until the mechanism adapters offer
"read the current version" and "reverse with the version as a precondition" themselves. Every
call here is network I/O: callers make it outside any database transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from django.conf import settings

from stopdesk.models import ExternalRecord
from stopdesk.record_ids import UnsafeRecordId, path_segment, read_back_problem

REPORT_ONLY = "report_only"


@dataclass(frozen=True)
class Action:
    name: str
    label: str
    writes: bool  # False: nothing is sent to the other system (report only)


class CompensationError(Exception):
    """The other system refused or failed; the compensation fails with this message."""


class StaleVersion(CompensationError):
    """The record is no longer at the version the compensation was approved against."""

    def __init__(self, expected: str, observed: str) -> None:
        self.expected = expected
        self.observed = observed
        super().__init__(f"expected version {expected}, the record is at version {observed}")


class Compensator(Protocol):
    def actions(self, record: ExternalRecord) -> list[Action]: ...

    def read_version(self, record: ExternalRecord) -> str: ...

    def run(self, record: ExternalRecord, action: str, expected_version: str) -> dict[str, Any]: ...


def normalize_version(value: str | int | None) -> str:
    """`W/"v3"`, `"v3"`, `v3` and `3` are one version: systems and runtimes spell ETags differently."""
    text = str(value if value is not None else "").strip()
    return text.removeprefix("W/").strip('"').removeprefix("v")


REPORT = Action(REPORT_ONLY, "Report only (nothing can be reversed)", writes=False)


class ReportOnly:
    """For effects nobody can take back (a sent email): the compensation is a recorded report."""

    def actions(self, record: ExternalRecord) -> list[Action]:
        return [REPORT]

    def read_version(self, record: ExternalRecord) -> str:
        return normalize_version(record.version)

    def run(self, record: ExternalRecord, action: str, expected_version: str) -> dict[str, Any]:
        if action != REPORT_ONLY:
            raise CompensationError(f"{record.system} supports only {REPORT_ONLY}, not {action}")
        return {"reported": True, "note": f"{record.system} {record.record_id} cannot be reversed; reported only."}


class CRMCompensator:
    """The CRM's HTTP API: `GET /records/{id}` returns the version, `POST /records/{id}/archive`
    takes `If-Match` and answers 412 when the record moved on."""

    ARCHIVE = Action("archive", "Archive the record", writes=True)

    def __init__(self, system: str = "crm") -> None:
        self.system = system

    def _client(self) -> httpx.Client:
        conf: dict[str, Any] = settings.STOPDESK_SYSTEMS[self.system]
        return httpx.Client(base_url=conf["base_url"], timeout=conf.get("timeout", 10.0))

    def actions(self, record: ExternalRecord) -> list[Action]:
        return [self.ARCHIVE, REPORT] if record.reversible else [REPORT]

    def read_version(self, record: ExternalRecord) -> str:
        with self._client() as client:
            response = client.get(f"/records/{_segment(record)}")
        if response.status_code != 200:
            raise CompensationError(f"reading {record.record_id}: HTTP {response.status_code} {response.text[:200]}")
        body = response.json()
        if (problem := read_back_problem(record.record_id, body)) is not None:
            raise CompensationError(f"reading {record.record_id}: {problem}; nothing was written")
        return normalize_version(body.get("version"))

    def run(self, record: ExternalRecord, action: str, expected_version: str) -> dict[str, Any]:
        if action == REPORT_ONLY:
            return ReportOnly().run(record, action, expected_version)
        if action != "archive":
            raise CompensationError(f"the CRM cannot {action}")
        with self._client() as client:
            response = client.post(
                f"/records/{_segment(record)}/archive",
                headers={"If-Match": f'"v{normalize_version(expected_version)}"', "X-Actor": "stopdesk:compensation"},
            )
        if response.status_code == 412:
            raise StaleVersion(normalize_version(expected_version), normalize_version(response.json().get("version")))
        if response.status_code != 200:
            raise CompensationError(f"archive {record.record_id}: HTTP {response.status_code} {response.text[:200]}")
        body = response.json()
        return {"status": body.get("status"), "version": normalize_version(body.get("version"))}


def _segment(record: ExternalRecord) -> str:
    try:
        return path_segment(record.record_id)
    except UnsafeRecordId as exc:
        raise CompensationError(str(exc)) from None


_REGISTRY: dict[str, Compensator] = {
    "crm": CRMCompensator("crm"),
    "mail": ReportOnly(),
    "outbox": ReportOnly(),
}


def compensator_for(system: str) -> Compensator:
    """Unknown systems get report-only: never guess how to reverse something."""
    return _REGISTRY.get(system, ReportOnly())


def compensator_register(system: str, compensator: Compensator) -> None:
    _REGISTRY[system] = compensator
