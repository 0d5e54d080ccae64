"""Mechanism facts recorded on an item are audited like its handle and its evidence."""

from __future__ import annotations

import pytest

from stopdesk.models import Event
from stopdesk.services.items import item_record_detail
from tests.factories import make_item, make_task


@pytest.mark.django_db
def test_recording_detail_writes_an_event_once_per_change():
    item = make_item(make_task(), mechanism="manual")
    facts = {"mcp": {"server": "tools", "protocol_version": "2025-06-18"}}

    item_record_detail(item_id=item.pk, detail=facts, actor="runtime")
    item_record_detail(item_id=item.pk, detail=facts, actor="runtime")  # the same facts again

    item.refresh_from_db()
    assert item.detail["mcp"] == facts["mcp"]
    (event,) = Event.objects.filter(item=item, kind="detail_recorded")
    assert (event.actor, event.from_state, event.to_state) == ("runtime", item.state, item.state)
    assert event.data == {"detail": facts}
