"""An item's registration is one value, `ItemSpec`, from the clients to the transitions: the API's
schema validates exactly its fields, and the spec form registers what the keyword form does."""

from __future__ import annotations

import dataclasses

from stopdesk.agent import schemas
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.client import ItemSpec
from stopdesk.models import WorkItem
from stopdesk.protocol.spec import ITEM_FIELDS


def test_the_api_schema_validates_exactly_the_specs_fields():
    assert set(schemas.RegisterItem.model_fields) == set(ITEM_FIELDS)
    assert set(schemas.RegisterStarted.model_fields) - set(ITEM_FIELDS) == {"submit_key", "worker", "lease_seconds"}


def test_a_validated_registration_is_the_spec_it_was_built_from():
    spec = ItemSpec(kind="local_worker", noun="draft", label="Draft 1", detail={"step": 1})
    assert schemas.RegisterItem.parse(spec.to_json()).spec() == spec
    assert dataclasses.replace(spec, label="") != spec


def test_register_and_register_spec_record_the_same_item(db):
    sd = LocalRuntime(actor="agent:test", dispatch=lambda ids: None)
    task = sd.create_task("Analyse invoices")
    by_keywords = sd.register(task.id, kind="local_worker", noun="draft", label="Draft 1", idempotency_key="k-1")
    spec = ItemSpec(kind="local_worker", noun="draft", label="Draft 1", idempotency_key="k-1")
    by_spec = sd.register_spec(task.id, spec)

    columns = [*ITEM_FIELDS]
    columns[columns.index("parent")] = "parent_id"
    first, second = (WorkItem.objects.filter(pk=i.id).values(*columns).get() for i in (by_keywords, by_spec))
    assert first == second
