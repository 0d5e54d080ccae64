"""The sandbox CRM over real HTTP: idempotent creates, versions, If-Match archive, faults."""

from __future__ import annotations

import time

import httpx
import pytest

from reconcile.mechanisms.http.sandbox import CRM
from stopdrill.sandbox.server import BackgroundServer

Crm = tuple[CRM, BackgroundServer]


def client(server: BackgroundServer, timeout: float = 5.0) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=timeout)


def create(http: httpx.Client, key: str = "task-1/item-1", **fields: object) -> httpx.Response:
    return http.post("/records", json=fields or {"name": "Acme"}, headers={"Idempotency-Key": key})


def test_create_is_idempotent_per_key_and_a_replay_is_200(crm: Crm) -> None:
    party, server = crm
    http = client(server)

    first = create(http)
    replay = create(http)
    other = create(http, key="task-1/item-2")

    assert first.status_code == 201
    assert first.headers["etag"] == '"v1"'
    assert replay.status_code == 200
    assert replay.json()["id"] == first.json()["id"]
    assert other.json()["id"] != first.json()["id"]
    assert len(party.records()) == 2
    assert party.counts.count("create", "task-1/item-1") == 2


def test_reusing_a_key_for_a_different_body_is_422(crm: Crm) -> None:
    _, server = crm
    http = client(server)
    create(http, name="Acme")

    assert create(http, name="Globex").status_code == 422


def test_lookup_by_idempotency_key_finds_the_record_or_404s(crm: Crm) -> None:
    _, server = crm
    http = client(server)
    record_id = create(http).json()["id"]

    found = http.get("/records", params={"idempotency_key": "task-1/item-1"})
    missing = http.get("/records", params={"idempotency_key": "never-sent"})

    assert found.status_code == 200
    assert found.json()["id"] == record_id
    assert missing.status_code == 404


def test_an_edit_by_someone_else_bumps_the_version_and_the_etag(crm: Crm) -> None:
    _, server = crm
    http = client(server)
    record_id = create(http).json()["id"]

    edited = http.post(f"/records/{record_id}/edit", json={"phone": "555"}, headers={"X-Actor": "dana"})
    read = http.get(f"/records/{record_id}")

    assert edited.status_code == 200
    assert read.json()["version"] == 2
    assert read.headers["etag"] == '"v2"'
    assert read.json()["updated_by"] == "dana"
    assert read.json()["fields"] == {"name": "Acme", "phone": "555"}


def test_archive_requires_if_match_and_refuses_a_stale_version(crm: Crm) -> None:
    party, server = crm
    http = client(server)
    record_id = create(http).json()["id"]
    party.edit(record_id, actor="dana", note="called them")

    missing = http.post(f"/records/{record_id}/archive")
    stale = http.post(f"/records/{record_id}/archive", headers={"If-Match": '"v1"'})

    assert missing.status_code == 428
    assert stale.status_code == 412
    assert stale.json()["version"] == 2
    assert party.get(record_id)["status"] == "active"  # type: ignore[index]


def test_archive_at_the_current_version_succeeds_and_a_retry_is_a_200_replay(crm: Crm) -> None:
    _party, server = crm
    http = client(server)
    record_id = create(http).json()["id"]

    archived = http.post(f"/records/{record_id}/archive", headers={"If-Match": '"v1"'})
    retried = http.post(f"/records/{record_id}/archive", headers={"If-Match": '"v1"'})
    edit_after = http.post(f"/records/{record_id}/edit", json={"x": 1})

    assert archived.status_code == 200
    assert archived.json()["status"] == "archived"
    assert retried.status_code == 200
    assert retried.json()["version"] == archived.json()["version"] == 2
    assert edit_after.status_code == 409


@pytest.mark.parametrize(("fault", "landed"), [("fail_500", False), ("fail_500_after_commit", True)])
def test_500_faults_differ_in_whether_the_create_landed(crm: Crm, fault: str, landed: bool) -> None:
    party, server = crm
    http = client(server)
    party.set_fault(fault, target="task-1/item-1")

    answer = create(http)
    lookup = http.get("/records", params={"idempotency_key": "task-1/item-1"})

    assert answer.status_code == 500
    assert lookup.status_code == (200 if landed else 404)
    assert create(http, key="unaffected").status_code == 201


@pytest.mark.parametrize(("fault", "landed"), [("hang", False), ("hang_after_commit", True)])
def test_hang_faults_time_out_and_only_a_lookup_tells_whether_it_landed(crm: Crm, fault: str, landed: bool) -> None:
    party, server = crm
    party.set_fault(fault)

    with pytest.raises(httpx.ReadTimeout):
        create(client(server, timeout=0.3))
    party.clear_faults()
    lookup = client(server).get("/records", params={"idempotency_key": "task-1/item-1"})

    assert lookup.status_code == (200 if landed else 404)


def test_the_page_lists_records_and_its_form_edits_as_someone_else(crm: Crm) -> None:
    party, server = crm
    http = client(server)
    record_id = create(http, name="Initech").json()["id"]

    page = http.get("/")
    submitted = http.post(f"/records/{record_id}/edit", data={"actor": "someone else"})

    assert "Initech" in page.text
    assert f'action="/records/{record_id}/edit"' in page.text
    assert submitted.status_code == 303
    assert party.get(record_id)["version"] == 2  # type: ignore[index]
    assert party.get(record_id)["updated_by"] == "someone else"  # type: ignore[index]


def test_latency_and_counts_are_visible_over_http_control(crm: Crm) -> None:
    _, server = crm
    http = client(server)
    assert http.post("/_control/config", json={"latency_s": 0.2}).status_code == 200

    began = time.monotonic()
    create(http)
    elapsed = time.monotonic() - began
    stats = http.get("/_control/stats").json()

    assert elapsed >= 0.2
    assert stats["endpoints"]["create"] == 1
