"""Completed effects outside of a compensation: reading a record's current version through its
adapter (the ledger learns it), and one person's decisions on effects that need no second person
(accept as is; put an effect completed before Stop on the reversal list).

A read talks to the other system outside any transaction: the intent is committed first (a read
row with no answer), then the call, then the answer in a new transaction (pretix's pattern).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.adapter import HttpOperation
from reconcile.models import Compensation, RecordDecision, RecordDecisionKind, RecordReading
from stopdesk.models import ExternalRecord
from stopdesk.services.errors import LedgerError
from stopdesk.services.events import actor_for, event_record
from stopdesk.states import CompensationState

C = CompensationState
D = RecordDecisionKind
DECIDE_PERMISSION = "reconcile.propose_compensation"
BULK_LIMIT = 500


class RecordDecisionRefused(LedgerError):
    code = "record_decision_refused"


def normalize_version(value: str | int | None) -> str:
    """`W/"v3"`, `"v3"`, `v3` and `3` are one version: systems and runtimes spell ETags differently."""
    text = str(value if value is not None else "").strip()
    return text.removeprefix("W/").strip('"').removeprefix("v")


def _http() -> HttpOperation:
    return cast(HttpOperation, registry.get("http"))


def record_read(*, record_id: int, actor: str, compensation_id: int | None = None) -> RecordReading:
    """Read the record's current version and fields through the HTTP adapter and keep what was
    seen. A version that moved on is learned by the ledger (the record row takes it, with an event
    saying from which version), so every later proposal starts from what the system holds now."""
    with transaction.atomic():
        record = ExternalRecord.objects.select_related("item").get(pk=record_id)
        reading = RecordReading.objects.create(external_record=record, compensation_id=compensation_id, actor=actor)
        _event(record, "record_read_requested", actor, f"Reading {record.system} {record.record_id}.", reading)
    # Outside any transaction: the other system may be slow, and our rows must not wait on it.
    read = _http().read_version(record)
    return record_read_answered(
        reading=reading,
        ok=read.ok,
        version=read.version,
        status=read.status,
        fields=read.body,
        error=_read_error(read.status_code, read.error),
    )


def record_read_answered(
    *, reading: RecordReading, ok: bool, version: str, status: str = "", fields: dict[str, Any], error: str = ""
) -> RecordReading:
    """Record the answer to a read (also used when the compensation's own execution read it)."""
    version = normalize_version(version) if ok else ""
    shown = fields.get("fields") if isinstance(fields.get("fields"), dict) else fields
    with transaction.atomic():
        RecordReading.objects.filter(pk=reading.pk).update(
            answered_at=timezone.now(), ok=ok, version=version, status=status[:64], fields=shown or {}, error=error
        )
        reading.refresh_from_db()
        record = (
            ExternalRecord.objects.select_for_update(of=("self",))
            .select_related("item")
            .get(pk=reading.external_record_id)
        )
        if not ok:
            _event(record, "record_read_failed", reading.actor, f"Could not read it: {error}", reading)
            return reading
        _event(record, "record_read", reading.actor, f"Read at version {version or 'unknown'}.", reading)
        record_learn_version(record=record, version=version, actor=reading.actor)
    return reading


def record_learn_version(*, record: ExternalRecord, version: str, actor: str) -> None:
    """The record row takes a version its system answered with, with an event saying from which
    version. Inside the caller's transaction."""
    version = normalize_version(version)
    if not version or normalize_version(record.version) == version:
        return
    # Conditional: only the version we knew is replaced, so two answers cannot undo each other.
    if ExternalRecord.objects.filter(pk=record.pk, version=record.version).update(version=version):
        event_record(
            kind="record_version_learned",
            actor=actor,
            item=record.item,
            message=f"{record.system} {record.record_id} is now at version {version} "
            f"(stopdesk knew version {record.version or 'none'}).",
            data={"record": f"{record.system}:{record.record_id}", "before": record.version, "after": version},
        )


def record_readings_compared(*, compensation: Compensation) -> VersionsCompared | None:
    """The record at the compensation's expected version beside its latest reading, field by
    field, when stopdesk has read it at all."""
    readings = list(RecordReading.objects.filter(external_record=compensation.external_record_id, ok=True))
    if not readings:
        return None
    current = readings[0]
    expected = normalize_version(compensation.expected_version)
    before = next((r for r in readings if r.version == expected), None)
    names = sorted(set(current.fields) | set(before.fields if before else {}))
    rows = [
        FieldRow(
            name,
            _shown(before.fields.get(name)) if before else None,
            _shown(current.fields.get(name)),
            differs=before is not None and before.fields.get(name) != current.fields.get(name),
        )
        for name in names
    ]
    rows.sort(key=lambda row: not row.differs)  # what changed first
    return VersionsCompared(expected=expected, before=before, current=current, rows=rows)


@dataclass(frozen=True)
class FieldRow:
    name: str
    before: Any
    current: Any
    differs: bool


@dataclass(frozen=True)
class VersionsCompared:
    expected: str
    before: RecordReading | None  # None: stopdesk never read the record at the expected version
    current: RecordReading
    rows: list[FieldRow]

    @property
    def changed(self) -> bool:
        return self.current.version != self.expected

    @property
    def single(self) -> bool:
        """The expected version and the latest read are one and the same reading."""
        return self.before is not None and self.before.pk == self.current.pk

    @property
    def differing(self) -> list[FieldRow]:
        return [row for row in self.rows if row.differs]


def records_accept_as_is(*, record_ids: Iterable[int], by: Any, note: str) -> list[ExternalRecord]:
    """One person accepts completed effects as they are: nothing is sent anywhere, so no second
    person is needed. One note for all; each record gets its own decision and its own event. A
    record with a compensation under way or done is refused, and then nothing is written."""
    if not by.has_perm(DECIDE_PERMISSION):
        raise RecordDecisionRefused("Accepting an effect as it is needs the reviewer role.")
    note = note.strip()
    if not note:
        raise RecordDecisionRefused("Say why these effects can stay as they are.")
    ids = sorted({int(pk) for pk in record_ids})
    if not ids:
        raise RecordDecisionRefused("Choose at least one effect.")
    if len(ids) > BULK_LIMIT:
        raise RecordDecisionRefused(f"Accept at most {BULK_LIMIT} effects at once.")
    with transaction.atomic():
        records = list(
            ExternalRecord.objects.select_for_update(of=("self",))
            .select_related("item")
            .filter(pk__in=ids)
            .order_by("pk")
        )
        if len(records) != len(ids):
            raise RecordDecisionRefused("Some of the chosen effects do not exist.")
        busy = [r for r in records if r.compensations.exclude(state__in=(C.REJECTED, C.FAILED)).exists()]
        if busy:
            names = ", ".join(f"{r.system} {r.record_id}" for r in busy[:5])
            raise RecordDecisionRefused(f"These have a compensation in progress or done: {names}.")
        accepted = set(
            RecordDecision.objects.filter(external_record__in=records, kind=D.ACCEPTED).values_list(
                "external_record_id", flat=True
            )
        )
        for record in records:
            if record.pk in accepted:
                continue  # accepted already: said once, not twice
            _decide(record, D.ACCEPTED, by, note)
    return records


def record_flag_for_reversal(*, record_id: int, by: Any, note: str = "") -> RecordDecision:
    """Put an effect completed before Stop on the reversal list: a reviewer thinks it may need undoing."""
    if not by.has_perm(DECIDE_PERMISSION):
        raise RecordDecisionRefused("Putting an effect on the reversal list needs the reviewer role.")
    with transaction.atomic():
        record = ExternalRecord.objects.select_for_update(of=("self",)).select_related("item").get(pk=record_id)
        if record.decisions.filter(kind__in=(D.ACCEPTED, D.FLAGGED)).exists():
            raise RecordDecisionRefused("Someone already decided about this effect.")
        return _decide(record, D.FLAGGED, by, note.strip())


def record_accept_escalated(*, compensation: Compensation, by: Any, note: str) -> RecordDecision:
    """The decision row that goes with accepting an escalated compensation's record as it is
    (called by compensation_accept_as_is inside its transaction)."""
    return _decide(compensation.external_record, D.ACCEPTED, by, note, compensation=compensation)


def _decide(
    record: ExternalRecord, kind: str, by: Any, note: str, compensation: Compensation | None = None
) -> RecordDecision:
    decision = RecordDecision.objects.create(
        external_record=record, kind=kind, by=by, note=note, compensation=compensation
    )
    words = {D.ACCEPTED.value: "Accepted as it is", D.FLAGGED.value: "Put on the reversal list"}[kind]
    event_record(
        kind=f"record_{kind}",
        actor=actor_for(by),
        item=record.item,
        message=f"{words}: {record.system} {record.record_id}." + (f" {note}" if note else ""),
        data={
            "record": f"{record.system}:{record.record_id}",
            "decision": decision.pk,
            "note": note,
            **({"compensation": compensation.pk} if compensation else {}),
        },
    )
    return decision


def _event(record: ExternalRecord, kind: str, actor: str, message: str, reading: RecordReading) -> None:
    event_record(
        kind=kind,
        actor=actor,
        item=record.item,
        message=f"{record.system} {record.record_id}: {message}",
        data={
            "record": f"{record.system}:{record.record_id}",
            "reading": reading.pk,
            **({"compensation": reading.compensation_id} if reading.compensation_id else {}),
            **({"version": reading.version} if reading.version else {}),
        },
    )


def _shown(value: Any) -> str | None:
    """A field's value as a person reads it: text as it is, anything else as JSON (never Python's repr)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _read_error(status_code: int | None, error: str) -> str:
    return f"{f'HTTP {status_code} ' if status_code else ''}{error}".strip()
