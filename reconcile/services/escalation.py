"""The ways out of an escalated compensation, for the person deciding: read the record again,
propose the same action again at the version the record is at now (a new proposal, approved on
its own), or accept the record as it is (one person; nothing is written anywhere).

Each way out locks the compensation, then its record, in that order (a decision row's foreign
key locks the record too): two people choosing at once get one decision and one refusal.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from reconcile.models import Compensation, Escalation
from reconcile.services.compensation import (
    APPROVE_PERMISSION,
    PROPOSE_PERMISSION,
    C,
    CompensationRefused,
    _propose,
    compensation_move,
)
from reconcile.services.records import normalize_version, record_accept_escalated, record_read
from stopdesk.models import ExternalRecord
from stopdesk.services.events import actor_for


def compensation_reread(*, compensation_id: int, by: Any) -> Compensation:
    """Read the record of an escalated compensation again, for the person deciding: what it holds
    now, at which version. Writes nothing to the other system."""
    if not (by.has_perm(APPROVE_PERMISSION) or by.has_perm(PROPOSE_PERMISSION)):
        raise CompensationRefused("Reading the record again needs the reviewer or approver role.")
    compensation = Compensation.objects.select_related("external_record").get(pk=compensation_id)
    if compensation.state != C.ESCALATED:
        raise CompensationRefused(f"This compensation is {compensation.state}; only an escalated one is read again.")
    reading = record_read(
        record_id=compensation.external_record_id, actor=actor_for(by), compensation_id=compensation.pk
    )
    if reading.ok:
        Compensation.objects.filter(pk=compensation.pk, state=C.ESCALATED).update(observed_version=reading.version)
    compensation.refresh_from_db()
    return compensation


def compensation_propose_current(*, compensation_id: int, by: Any, note: str = "") -> Compensation:
    """The way out of a stale-version escalation: close it and propose the same action again at
    the version the record is at now. The new proposal needs its own approval by someone other
    than `by`; the old one can never run."""
    if not (by.has_perm(APPROVE_PERMISSION) or by.has_perm(PROPOSE_PERMISSION)):
        raise CompensationRefused("Proposing a compensation needs the reviewer or approver role.")
    with transaction.atomic():
        # The compensation first, then its record (see the module docstring).
        old = Compensation.objects.select_for_update().get(pk=compensation_id)
        record = ExternalRecord.objects.select_for_update().get(pk=old.external_record_id)
        current = normalize_version(record.version)
        if old.state == C.ESCALATED and current == normalize_version(old.expected_version):
            raise CompensationRefused(
                f"stopdesk knows of no version newer than {current or 'the proposed one'}; read the record again first."
            )
        now = timezone.now()
        compensation_move(
            old,
            (C.ESCALATED,),
            C.REJECTED,
            actor_for(by),
            "compensation_superseded",
            f"Replaced by a proposal at version {current}.",
            rejected_by=by,
            decided_at=now,
            reason=f"Proposed again at version {current}.",
        )
        Escalation.objects.filter(compensation=old, closed_at__isnull=True).update(closed_at=now)
        return _propose(record_id=record.pk, action=old.action, by=by, note=note.strip() or old.note, supersedes=old)


def compensation_accept_as_is(*, compensation_id: int, by: Any, note: str) -> Compensation:
    """The other way out of an escalation: nothing is reversed, the record stays as it is. One
    person decides (nothing is written anywhere); the decision and its note are audited."""
    if not (by.has_perm(APPROVE_PERMISSION) or by.has_perm(PROPOSE_PERMISSION)):
        raise CompensationRefused("Accepting a record as it is needs the reviewer or approver role.")
    if not note.strip():
        raise CompensationRefused("Say why the record can stay as it is.")
    with transaction.atomic():
        compensation = Compensation.objects.select_for_update().get(pk=compensation_id)
        now = timezone.now()
        compensation_move(
            compensation,
            (C.ESCALATED,),
            C.REJECTED,
            actor_for(by),
            "compensation_accepted_as_is",
            f"Accepted the record as it is: {note.strip()}",
            rejected_by=by,
            decided_at=now,
            reason=f"Accepted as it is: {note.strip()}",
        )
        Escalation.objects.filter(compensation=compensation, closed_at__isnull=True).update(closed_at=now)
        record_accept_escalated(compensation=compensation, by=by, note=note.strip())
    return compensation
