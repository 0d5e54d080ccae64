"""The HTTP adapter's generic path treats record ids as data: one encoded segment, verified on read."""

from __future__ import annotations

import pytest

from reconcile.mechanisms import registry
from stopdesk.models import ExternalRecord
from stopdesk.services.items import item_attach_record, item_record_detail, item_register
from stopdesk.services.transitions import item_submit
from stopdesk.states import Kind
from tests.factories import ACTOR, make_task
from tests.reconcile.test_http import crm_declaration

pytestmark = pytest.mark.django_db


def read_version(record):  # type: ignore[no-untyped-def]
    return registry.get("http").read_version(record)  # type: ignore[attr-defined]


def reverse(record, expected_version):  # type: ignore[no-untyped-def]
    return registry.get("http").reverse(record, expected_version)  # type: ignore[attr-defined]


AWKWARD = ["a%2Fb", "what?x=1", "hash#frag", "two words", "Zürich-日本-🙂", "y" * 200, "%2e%2e", "~user;p=1"]
UNSAFE = ["decoy-0704/../crm-2", "../crm-2", "..", ".", "crm-2/", "a\\..\\crm-2", "tab\tid", "\u202ecrm"]


def _record(base: str, record_id: str) -> ExternalRecord:
    item = item_register(task=make_task(), kind=Kind.EXTERNAL_OPERATION, noun="record", actor=ACTOR, mechanism="http")
    item_submit(item_id=item.pk, idempotency_key=f"k-{item.pk}", actor=ACTOR)
    item_record_detail(item_id=item.pk, detail={"http": crm_declaration(base)}, actor=ACTOR)
    return item_attach_record(
        item_id=item.pk, system="crm", record_id=record_id, effect="created", actor=ACTOR, version="1"
    )


@pytest.mark.parametrize("record_id", AWKWARD, ids=repr)
def test_read_and_reverse_reach_exactly_the_recorded_record(crm_party, record_id):
    party, base = crm_party
    party.seed("crm-2", name="Bystander")
    party.seed("a", name="Bystander a")
    party.seed(record_id, name="Target")
    record = _record(base, record_id)
    seen = registry.get("http").read_version(record)
    assert seen.ok and seen.version == "1", seen.error
    assert registry.get("http").reverse(record, seen.version).done
    assert party.get(record_id)["status"] == "archived"
    assert party.get("crm-2")["status"] == "active" and party.get("a")["status"] == "active"


@pytest.mark.parametrize("record_id", UNSAFE, ids=repr)
def test_an_unsafe_id_already_stored_is_never_sent(crm_party, record_id):
    """A row written before ids were checked (raw SQL here) reaches no URL at all."""
    party, base = crm_party
    party.seed("crm-2", name="Victim")
    record = _record(base, "placeholder")
    ExternalRecord.objects.filter(pk=record.pk).update(record_id=record_id)
    record.refresh_from_db()
    seen = registry.get("http").read_version(record)
    assert not seen.ok and "record id" in seen.error
    done = registry.get("http").reverse(record, "1")
    assert done.outcome == "error" and "record id" in done.error
    assert party.counts.count("get") == 0 and party.counts.count("archive") == 0
    assert party.get("crm-2")["status"] == "active"


def test_a_read_back_of_another_record_is_not_ok(crm_party):
    party, base = crm_party
    party.seed("crm-2", name="Survivor")
    party.seed("crm-3", name="Merged away")
    party.merge("crm-3", into="crm-2")
    seen = registry.get("http").read_version(_record(base, "crm-3"))
    assert not seen.ok and "'crm-3'" in seen.error and "'crm-2'" in seen.error


def test_a_system_that_names_records_like_paths_leaves_the_item_for_review_not_a_crash(crm_party):
    """Google-style resource names ("accounts/1") cannot be recorded for a later reversal: the
    action happened, so the item becomes uncertain with the reason, and nothing is recorded."""
    from reconcile.mechanisms.base import ItemRef
    from reconcile.mechanisms.registry import get
    from stopdesk.models import WorkItem
    from tests.reconcile.test_http import create_record, registered

    party, base = crm_party
    party.configure(id_prefix="accounts/")
    item = registered(make_task())
    submitted = create_record(item, base)
    assert submitted.accepted and submitted.record is None and "must not contain /" in submitted.error
    item.refresh_from_db()
    assert item.state == "uncertain" and "accounts/1" in item.outcome
    assert not ExternalRecord.objects.exists()
    seen = get("http").inspect(ItemRef.of(WorkItem.objects.get(pk=item.pk)))
    assert seen.seen == "unknowable" and "accounts/1" in seen.message
