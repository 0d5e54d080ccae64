"""Rows written before declarations were refused: a migration sets their overrides aside (kept,
never used) and flags the item for review with an event; clean rows are left alone."""

from __future__ import annotations

from importlib import import_module

import pytest
from django.apps import apps

from stopdesk.models import Event, WorkItem
from stopdesk.states import ItemState
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db
migration = import_module("stopdesk.migrations.0018_flag_declared_endpoint_overrides")


def test_an_item_carrying_a_reversal_url_and_a_base_url_is_set_aside_and_flagged():
    task = make_task()
    crm = make_item(task, kind="external_operation", mechanism="http", state=ItemState.COMPLETED)
    model = make_item(task, mechanism="openai", state=ItemState.RUNNING)
    clean = make_item(task, mechanism="http")
    WorkItem.objects.filter(pk=crm.pk).update(
        detail={
            "http": {
                "system": "crm",
                "effect": "created",
                "reverse": {"action": "archive", "url": "http://crm/records/acc-9/archive"},
            }
        }
    )
    WorkItem.objects.filter(pk=model.pk).update(detail={"openai": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}})
    WorkItem.objects.filter(pk=clean.pk).update(detail={"http": {"system": "crm"}})

    migration.flag(apps, None)

    crm.refresh_from_db()
    model.refresh_from_db()
    clean.refresh_from_db()
    assert crm.detail["http"] == {"system": "crm", "effect": "created"}
    assert crm.detail["overrides_refused"] == {
        "detail.http.reverse": {"action": "archive", "url": "http://crm/records/acc-9/archive"}
    }
    assert model.detail["openai"] == {"model": "m"}
    assert model.detail["overrides_refused"] == {"detail.openai.base_url": "http://127.0.0.1:9/v1"}
    assert crm.needs_review and model.needs_review and not clean.needs_review
    flagged = Event.objects.filter(kind="declaration_flagged")
    assert sorted(flagged.values_list("item_id", flat=True)) == sorted([crm.pk, model.pk])
    assert "detail.http.reverse" in flagged.get(item_id=crm.pk).message
    assert crm.state == ItemState.COMPLETED  # flagged, not moved
    # Running it again finds nothing more.
    migration.flag(apps, None)
    assert Event.objects.filter(kind="declaration_flagged").count() == 2
