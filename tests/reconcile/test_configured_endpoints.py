"""Where the server sends requests and credentials is configuration: an item's declaration that
names a URL (a row written before such declarations were refused) is never used, and the
server's key never leaves for an address nobody configured."""

from __future__ import annotations

import pytest

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import ItemRef
from reconcile.services.cancel import item_cancel
from stopdesk.models import WorkItem
from stopdesk.states import ItemState
from tests.factories import make_external_effect, make_task
from tests.listener import Listener
from tests.reconcile.conftest import configure_openai, configure_system
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
    http.cancel(ItemRef.of(item))
    record = item.external_records.get()
    http.read_version(record)  # type: ignore[attr-defined]
    http.reverse(record, "1")  # type: ignore[attr-defined]
    assert listener.arrivals == []


def _request_lines(listener) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.request.split(b"\r\n", 1)[0].decode() for a in listener.arrivals]


def test_a_handle_reaches_the_configured_endpoint_as_one_path_segment(settings, listener):
    configure_openai(settings, base_url=listener.url + "/v1", api_key=SERVER_KEY)
    item = make_external_effect(make_task())
    WorkItem.objects.filter(pk=item.pk).update(mechanism="openai", handle="../../admin?x=1#y")
    item.refresh_from_db()
    registry.get("openai").cancel(ItemRef.of(item))
    assert _request_lines(listener)[:2] == [
        "POST /v1/responses/..%2F..%2Fadmin%3Fx%3D1%23y/cancel HTTP/1.1",
        "GET /v1/responses/..%2F..%2Fadmin%3Fx%3D1%23y HTTP/1.1",
    ]


def test_an_idempotency_key_and_a_version_stay_data_in_the_configured_requests(settings, listener):
    configure_system(settings, "crm", base_url=listener.url)
    item = make_external_effect(make_task())
    WorkItem.objects.filter(pk=item.pk).update(idempotency_key="k&admin=1#x?y", detail={"http": {"system": "crm"}})
    item.refresh_from_db()
    http = registry.get("http")
    looked = http.inspect(ItemRef.of(item))
    assert _request_lines(listener) == ["GET /records?idempotency_key=k%26admin%3D1%23x%3Fy HTTP/1.1"]
    assert looked.remote_status == "unreadable answer"  # the listener's {} names no record
    # A key that cannot be one segment is not sent at all.
    WorkItem.objects.filter(pk=item.pk).update(idempotency_key="../admin")
    item.refresh_from_db()
    assert http.inspect(ItemRef.of(item)).remote_status == "unsafe key"
    assert len(listener.arrivals) == 1
    # A version cannot add a header to the reversal: the request is refused before it is sent.
    record = item.external_records.get()
    reversal = http.reverse(record, 'v1"\r\nX-Evil: 1')  # type: ignore[attr-defined]
    assert reversal.outcome == "error"
    assert not any(b"X-Evil" in a.request for a in listener.arrivals)
