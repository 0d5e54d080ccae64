"""Bytes PostgreSQL cannot store (NUL) in any query parameter, form field or JSON string: a 400
page naming the parameter on the dashboard and the admin, a 422 naming the field at the API,
never a 500, and nothing written. On PostgreSQL, where the 500 came from."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from stopdesk.models import Event, Task
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_create
from tests.factories import make_task
from tests.web.scenes import running_task, uncertain_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


def _names_the_parameter(response, name: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.status_code
    page = response.content.decode()
    assert f"&#x27;{name}&#x27;" in page and "NUL" in page


def test_a_nul_in_the_task_search_is_a_400_naming_q(as_user):
    make_task("Onboard customers")
    _names_the_parameter(as_user("operator").get("/tasks/?q=%00"), "q")


def test_a_nul_in_the_item_filter_is_a_400_naming_state(as_user):
    task = running_task()
    _names_the_parameter(as_user("operator").get(f"/tasks/{task.pk}/items/?state=x%00"), "state")


def test_a_nul_in_the_admin_timeline_filter_is_a_400_naming_kind(as_user):
    task = make_task("Onboard customers")
    _names_the_parameter(as_user("admin").get(f"/admin/stopdesk/task/{task.pk}/timeline/?kind=%00"), "kind")


def test_a_nul_in_the_admin_search_is_a_400_naming_q(as_user):
    make_task("Onboard customers")
    _names_the_parameter(as_user("admin").get("/admin/stopdesk/task/?q=%00"), "q")


def test_a_nul_in_a_form_field_is_a_400_naming_it_and_writes_nothing(as_user):
    item = uncertain_item()
    events = Event.objects.count()
    response = as_user("reviewer").post(
        f"/items/{item.pk}/resolve/", {"outcome": "completed", "note": "checked\x00the portal"}
    )
    _names_the_parameter(response, "note")
    assert Event.objects.count() == events


def test_a_nul_in_the_stop_reason_is_a_400_and_the_task_is_not_stopped(as_user):
    task = running_task()
    _names_the_parameter(as_user("operator").post(f"/tasks/{task.pk}/stop/", {"reason": "now\x00"}), "reason")
    task.refresh_from_db()
    assert task.stop_requested_at is None


def test_a_nul_in_the_sign_in_form_is_a_400():
    _names_the_parameter(Client().post("/login/", {"username": "admin\x00", "password": "x"}), "username")


@pytest.fixture
def token(db):  # type: ignore[no-untyped-def]
    return runtime_create(name="invoices-agent", actor="test")


def _api(token, method: str, path: str, body=None):  # type: ignore[no-untyped-def]
    return Client().generic(
        method,
        "/api/v1" + path,
        data=json.dumps(body) if body is not None else "",
        content_type="application/json",
        headers={"Authorization": f"Bearer {token[1]}"},
    )


def test_a_nul_in_an_api_query_string_is_a_422_naming_it(token):
    task = task_create(title="Analyse invoices", actor="test", runtime=token[0])
    answer = _api(token, "GET", f"/tasks/{task.pk}/stop/watch?timeout=1%00")
    assert answer.status_code == 422
    assert (answer.json()["error"], answer.json()["field"]) == ("invalid_field", "timeout")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": "Analyse\x00invoices"}, "title"),
    ],
)
def test_a_nul_in_an_api_json_string_is_a_422_naming_it(token, body, field):
    before = Task.objects.count()
    answer = _api(token, "POST", "/tasks", body)
    assert answer.status_code == 422 and answer.json()["field"] == field
    assert Task.objects.count() == before


@pytest.mark.parametrize(
    ("detail", "field"),
    [({"note": "a\x00b"}, "detail"), ({"a\x00b": 1}, "detail"), ({"tool": {"arguments": ["x\x00"]}}, "detail")],
)
def test_a_nul_anywhere_in_an_item_declaration_is_a_422_naming_it(token, detail, field):
    task = task_create(title="Analyse invoices", actor="test", runtime=token[0])
    answer = _api(token, "POST", f"/tasks/{task.pk}/items", {"kind": "local_worker", "noun": "x", "detail": detail})
    assert answer.status_code == 422 and answer.json()["field"] == field
    assert not task.items.exists()
