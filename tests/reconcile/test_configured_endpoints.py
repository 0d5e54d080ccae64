"""Where the server sends requests and credentials is configuration: an item's declaration that
names a URL (a row written before such declarations were refused) is never used, and the
server's key never leaves for an address nobody configured."""

from __future__ import annotations

import pytest

from reconcile.mechanisms import registry
from reconcile.services.cancel import item_cancel
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from tests.factories import make_external_effect, make_task
from tests.listener import Listener
from tests.reconcile.conftest import configure_openai
from tests.reconcile.helpers import stop
from tests.reconcile.test_openai import started

S = ItemState
pytestmark = pytest.mark.django_db
SERVER_KEY = "sk-server-secret-4242"


@pytest.fixture
def listener():  # type: ignore[no-untyped-def]
    with Listener() as it:
        yield it


def test_an_openai_item_naming_its_own_base_url_is_cancelled_at_the_configured_endpoint_only(
    settings, openai_party, listener, django_capture_on_commit_callbacks
):
    """The reproduction: an item carrying {"openai": {"base_url": <listener>}} is stopped; the
    listener must receive nothing (no cancel, no read-back, no bearer key)."""
    party, url = openai_party
    configure_openai(settings, api_key=SERVER_KEY)
    task = make_task()
    item, response = started(task, url)
    WorkItem.objects.filter(pk=item.pk).update(detail={"openai": {"base_url": listener.url + "/v1"}})
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    assert listener.arrivals == []
    assert party.counts.count("cancel", response.id) == 1
    item.refresh_from_db()
    assert item.state == S.CANCELLED


def test_an_http_item_naming_its_own_urls_is_looked_up_only_at_its_configured_system(
    settings, crm_party, listener, django_capture_on_commit_callbacks
):
    _party, _base = crm_party
    task = make_task()
    item = make_external_effect(task, system="crm")
    override = {
        "system": "crm",
        "lookup_url": listener.url + "/records?idempotency_key={idempotency_key}",
        "cancel_url": listener.url + "/ops/{idempotency_key}/cancel",
        "record_url": listener.url + "/records/{record_id}",
        "reverse": {"action": "archive", "url": listener.url + "/records/acc-9/archive"},
    }
    WorkItem.objects.filter(pk=item.pk).update(detail={"http": override}, idempotency_key="k-1")
    item.refresh_from_db()
    http = registry.get("http")
    http.cancel(http_ref(item))
    record = item.external_records.get()
    http.read_version(record)  # type: ignore[attr-defined]
    http.reverse(record, "1")  # type: ignore[attr-defined]
    assert listener.arrivals == []


def http_ref(item):  # type: ignore[no-untyped-def]
    from reconcile.mechanisms.base import ItemRef

    return ItemRef.of(item)
