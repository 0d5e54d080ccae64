"""External record ids are scoped to the runtime that reported them: another runtime can neither
block an effect from being recorded nor learn which ids exist. Two tasks that really touched one
record are both recorded and flagged for review."""

from __future__ import annotations

import pytest

from stopdesk.models import Event, ExternalRecord
from stopdesk.services.items import item_attach_record, task_create
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


@pytest.fixture
def mine(runtime):  # type: ignore[no-untyped-def]
    return task_create(title="Onboard customers", actor="test", runtime=runtime[0])


@pytest.fixture
def theirs(other_runtime):  # type: ignore[no-untyped-def]
    return task_create(title="Squatter", actor="test", runtime=other_runtime[0])


def _attach(api, item, record_id: str = "crm-58"):  # type: ignore[no-untyped-def]
    return api.post(f"/items/{item.pk}/records", {"system": "crm", "record_id": record_id, "effect": "created"})


def test_another_runtime_claiming_an_id_first_does_not_block_the_real_effect(api, other_api, mine, theirs):
    squat = _attach(other_api, make_item(theirs, state=S.RUNNING))
    assert squat.status == 201
    real_item = make_item(mine, state=S.RUNNING)
    real = _attach(api, real_item)
    assert real.status == 201, real.body
    assert ExternalRecord.objects.filter(system="crm", record_id="crm-58").count() == 2
    assert ExternalRecord.objects.get(item=real_item).record_id == "crm-58"


def test_another_runtime_cannot_tell_which_ids_exist(api, other_api, mine, theirs):
    _attach(api, make_item(mine, state=S.RUNNING), "crm-58")
    probe_held = make_item(theirs, state=S.RUNNING)
    probe_free = make_item(theirs, state=S.RUNNING)
    held = _attach(other_api, probe_held, "crm-58")
    free = _attach(other_api, probe_free, "crm-99")
    assert held.status == free.status == 201
    strip = lambda body: {k: v for k, v in body.items() if k not in ("id", "item", "record_id", "recorded_at")}  # noqa: E731
    assert strip(held.body) == strip(free.body)
    one, two = other_api.get(f"/items/{probe_held.pk}").body, other_api.get(f"/items/{probe_free.pk}").body
    assert one["needs_review"] == two["needs_review"] is False


def test_two_tasks_of_one_runtime_touching_one_record_are_both_recorded_and_flagged(api, mine, runtime):
    other_task = task_create(title="Also onboarding", actor="test", runtime=runtime[0])
    first, second = make_item(mine, state=S.RUNNING), make_item(other_task, state=S.RUNNING)
    assert _attach(api, first).status == 201
    assert _attach(api, second).status == 201
    for item in (first, second):
        item.refresh_from_db()
        assert item.needs_review and item.external_records.get().record_id == "crm-58"
        assert Event.objects.filter(item=item, kind="record_shared").count() == 1
    assert api.get(f"/items/{second.pk}").body["needs_review"] is True


def test_the_ledger_records_a_shared_record_on_both_items_and_flags_them():
    task = make_task()
    first, second = make_item(task, state=S.RUNNING), make_item(make_task(), state=S.RUNNING)
    item_attach_record(item_id=first.pk, system="crm", record_id="r-1", effect="created", actor="t", version="1")
    item_attach_record(item_id=first.pk, system="crm", record_id="r-1", effect="created", actor="t", version="2")
    item_attach_record(item_id=second.pk, system="crm", record_id="r-1", effect="updated", actor="t", version="3")
    assert (first.external_records.get().version, second.external_records.get().version) == ("2", "3")
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.needs_review and second.needs_review
