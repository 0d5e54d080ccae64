"""Record ids are data, never path: a compensation acts on exactly the record that was recorded."""

from __future__ import annotations

import pytest

from reconcile.models import Compensation
from reconcile.services.compensation import compensation_execute
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.models import ExternalRecord, Runtime
from stopdesk.protocol.errors import InvalidRequest
from stopdesk.services.errors import LedgerError
from stopdesk.services.items import item_attach_record, item_finish, item_register
from stopdesk.services.transitions import item_submit
from stopdesk.states import Kind
from tests.factories import ACTOR, make_task, set_state_by_hand
from tests.web.conftest import system_url
from tests.web.scenes import proposal

pytestmark = pytest.mark.django_db

# Each of these would leave its path segment (or be read as a directory step) in a URL.
UNSAFE = ["decoy-0704/../crm-2", "../crm-2", "..", ".", "crm-2/", "a\\..\\crm-2", "crm-2\n", "x" * 201, "", "\u202ecrm"]
# Each of these is one path segment once encoded, and must reach exactly this record.
AWKWARD = ["a%2Fb", "what?x=1", "hash#frag", "two words", "Zürich-日本-🙂", "y" * 200, "%2e%2e", "~user;p=1"]


def _effect(crm_url: str, record_id: str, *, version: str = "1") -> ExternalRecord:
    task = make_task("Onboard")
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor=ACTOR, mechanism="http")
    item_submit(item_id=item.pk, idempotency_key=f"k-{item.pk}", actor=ACTOR)
    record = item_attach_record(
        item_id=item.pk,
        system="crm",
        record_id=record_id,
        effect="created",
        actor=ACTOR,
        version=version,
        reversible=True,
        reversal="archive",
    )
    item_finish(item_id=item.pk, succeeded=True, actor=ACTOR)
    return record


def _run(record: ExternalRecord, roles) -> Compensation:  # type: ignore[no-untyped-def]
    c = proposal(record, roles["reviewer"])
    set_state_by_hand(Compensation.objects.filter(pk=c.pk), "approved")
    compensation_execute(compensation_id=c.pk)
    c.refresh_from_db()
    return c


@pytest.mark.parametrize("record_id", UNSAFE, ids=repr)
def test_an_id_that_cannot_be_one_path_segment_is_refused_when_attached(record_id):
    task = make_task()
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor=ACTOR, mechanism="http")
    item_submit(item_id=item.pk, idempotency_key="k", actor=ACTOR)
    with pytest.raises(LedgerError, match="record id"):
        item_attach_record(item_id=item.pk, system="crm", record_id=record_id, effect="created", actor=ACTOR)
    assert not ExternalRecord.objects.exists()


@pytest.mark.parametrize("record_id", UNSAFE, ids=repr)
def test_the_runtime_api_refuses_an_unsafe_id_naming_the_field(record_id):
    runtime = Runtime(name="agent")
    runtime.issue_token()
    runtime.save()
    sd = LocalRuntime(runtime=runtime)
    task = sd.create_task("Onboard")
    item = sd.register(task.id, kind="external_operation", noun="record", mechanism="http")
    sd.submit(item.id, idempotency_key="k")
    with pytest.raises(InvalidRequest) as refused:
        sd.attach_record(item.id, system="crm", record_id=record_id, effect="created")
    assert refused.value.status == 422 and refused.value.field == "record_id"
    assert not ExternalRecord.objects.exists()


def test_the_decoy_path_no_longer_archives_someone_elses_record(crm, roles, eager):
    """The reported attack: decoy/../victim was archived as the victim. Now it never gets recorded,
    and a row written before the fix (raw, bypassing the service) fails without a write."""
    base = system_url("crm")
    crm.seed("decoy-0704", name="Decoy")
    crm.seed("crm-2", name="Victim")
    record = _effect(base, "decoy-0704")
    ExternalRecord.objects.filter(pk=record.pk).update(record_id="decoy-0704/../crm-2")
    record.refresh_from_db()
    c = _run(record, roles)
    assert c.state == "failed" and "record id" in c.error
    assert crm.get("crm-2")["status"] == "active" and crm.counts.count("archive") == 0


@pytest.mark.parametrize("record_id", AWKWARD, ids=repr)
def test_an_awkward_id_reaches_exactly_its_own_record(crm, roles, eager, record_id):
    base = system_url("crm")
    crm.seed("crm-2", name="Bystander")
    crm.seed("a", name="Bystander a")
    crm.seed(record_id, name="Target")
    c = _run(_effect(base, record_id), roles)
    assert c.state == "done", c.error
    assert crm.get(record_id)["status"] == "archived"
    assert crm.get("crm-2")["status"] == "active" and crm.get("a")["status"] == "active"


def test_a_read_back_naming_another_record_is_refused_before_any_write(crm, roles, eager, settings):
    """A CRM answers a merged-away id with the surviving record (as CRMs do after a merge): the id
    read back has to be the recorded one, or nothing is written."""
    crm.seed("crm-2", name="Survivor")
    crm.seed("crm-3", name="Merged away")
    crm.merge("crm-3", into="crm-2")
    c = _run(_effect(system_url("crm"), "crm-3"), roles)
    assert c.state == "failed" and "crm-2" in c.error and "crm-3" in c.error
    assert crm.counts.count("archive") == 0 and crm.get("crm-2")["status"] == "active"
