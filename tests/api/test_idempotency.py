"""An Idempotency-Key stands for one request: the same body replays its first answer, a different
body under the same key is refused (422 idempotency_key_reused) and writes nothing."""

from __future__ import annotations

import pytest

from stopdesk.models import Event, ExternalRecord, Task
from stopdesk.services.items import task_create
from stopdesk.states import ItemState as S
from tests.api.conftest import ledger_counts
from tests.factories import make_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]
K = {"Idempotency-Key": "K-1"}


@pytest.fixture
def task(runtime):  # type: ignore[no-untyped-def]
    return task_create(title="Analyse invoices", actor="test", runtime=runtime[0])


def _refused(answer) -> None:  # type: ignore[no-untyped-def]
    assert answer.status == 422, answer.body
    assert answer.body["error"] == "idempotency_key_reused" and answer.body["field"] == "Idempotency-Key"


def test_a_new_title_under_the_same_key_is_refused_not_answered_with_the_first_task(api):
    first = api.post("/tasks", {"title": "Invoices"}, headers=K)
    before = ledger_counts()
    _refused(api.post("/tasks", {"title": "Payroll"}, headers=K))
    assert ledger_counts() == before and list(Task.objects.values_list("title", flat=True)) == ["Invoices"]
    again = api.post("/tasks", {"title": "Invoices"}, headers=K)
    assert again.status == 201 and again.body == first.body


def test_a_second_record_under_the_same_key_is_refused_and_the_first_stays(api, task):
    item = make_item(task, state=S.RUNNING)
    first = api.post(f"/items/{item.pk}/records", {"system": "crm", "record_id": "C-1", "effect": "created"}, headers=K)
    assert first.status == 201
    before = ledger_counts()
    _refused(
        api.post(f"/items/{item.pk}/records", {"system": "crm", "record_id": "C-2", "effect": "created"}, headers=K)
    )
    assert ledger_counts() == before and list(ExternalRecord.objects.values_list("record_id", flat=True)) == ["C-1"]


def test_failed_after_completed_under_the_same_key_is_refused_not_silently_replayed(api, task):
    item = make_item(task, state=S.RUNNING)
    assert api.post(f"/items/{item.pk}/finish", {"status": "completed"}, headers=K).status == 200
    before = ledger_counts()
    _refused(api.post(f"/items/{item.pk}/finish", {"status": "failed", "detail": "it broke"}, headers=K))
    assert ledger_counts() == before
    # Without the key the contradicting report is what it always was: a late result for review.
    late = api.post(f"/items/{item.pk}/finish", {"status": "failed", "detail": "it broke"})
    assert late.status == 200 and late.body["needs_review"] is True
    assert Event.objects.filter(item=item, kind="late_result").count() == 1


def test_a_start_by_another_worker_under_the_same_key_is_refused(api, task):
    item = make_item(task)
    assert api.post(f"/items/{item.pk}/start", {"worker": "w-1"}, headers=K).status == 200
    before = ledger_counts()
    _refused(api.post(f"/items/{item.pk}/start", {"worker": "w-2"}, headers=K))
    assert ledger_counts() == before


@pytest.mark.parametrize(
    ("path", "first", "second"),
    [
        ("items", {"kind": "model_request", "noun": "draft"}, {"kind": "model_request", "noun": "email"}),
        ("uncertain", {"detail": "timed out"}, {"detail": "refused"}),
        ("cancel", {"detail": "stopped"}, {"detail": "gave up"}),
    ],
)
def test_every_keyed_write_compares_the_body(api, task, path, first, second):
    item = make_item(task, state=S.RUNNING)
    url = f"/tasks/{task.pk}/items" if path == "items" else f"/items/{item.pk}/{path}"
    assert api.post(url, first, headers=K).status in (200, 201)
    before = ledger_counts()
    _refused(api.post(url, second, headers=K))
    assert ledger_counts() == before


def test_the_same_body_spelled_differently_is_the_same_request(api):
    """Key order and defaults spelled out do not change what was asked."""
    first = api.post("/tasks", {"title": "Invoices"}, headers=K)
    task_id = first.body["id"]
    body = {"kind": "model_request", "noun": "draft", "label": ""}
    one = api.post(f"/tasks/{task_id}/items", body, headers={"Idempotency-Key": "R"})
    two = api.post(f"/tasks/{task_id}/items", dict(reversed(list(body.items()))), headers={"Idempotency-Key": "R"})
    three = api.post(
        f"/tasks/{task_id}/items", {"noun": "draft", "kind": "model_request"}, headers={"Idempotency-Key": "R"}
    )
    assert one.status == two.status == three.status == 201 and one.body == two.body == three.body
