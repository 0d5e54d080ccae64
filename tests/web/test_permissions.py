"""Every page and action checks the role: anonymous goes to the login page, a wrong role gets 403."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import make_task
from tests.web.conftest import htmx
from tests.web.scenes import mail_effect, proposal, uncertain_item

pytestmark = pytest.mark.django_db


@pytest.fixture
def objects(roles):  # type: ignore[no-untyped-def]
    task = make_task("Visible task")
    item = uncertain_item()
    record = mail_effect()
    compensation = proposal(record, roles["reviewer"], action="report_only")
    return {"task": task.pk, "item": item.pk, "record": record.pk, "compensation": compensation.pk}


# (method, url name, kwargs key, roles allowed)
ACTIONS = [
    ("get", "task-list", None, {"operator", "reviewer", "approver"}),
    ("get", "task-detail", "task", {"operator", "reviewer", "approver"}),
    ("get", "task-items", "task", {"operator", "reviewer", "approver"}),
    ("get", "task-stop", "task", {"operator"}),
    ("post", "task-stop", "task", {"operator"}),
    ("get", "review-queue", None, {"reviewer", "approver"}),
    ("get", "item-resolve", "item", {"reviewer"}),
    ("post", "item-resolve", "item", {"reviewer"}),
    ("get", "item-extend", "item", {"reviewer"}),
    ("post", "item-extend", "item", {"reviewer"}),
    ("get", "item-escalate", "item", {"reviewer"}),
    ("post", "item-escalate", "item", {"reviewer"}),
    ("get", "record-propose", "record", {"reviewer"}),
    ("post", "record-propose", "record", {"reviewer"}),
    ("get", "compensation-detail", "compensation", {"reviewer", "approver"}),
    ("post", "compensation-approve", "compensation", {"approver"}),
    ("post", "compensation-reject", "compensation", {"approver"}),
    ("post", "compensation-escalate", "compensation", {"reviewer", "approver"}),
    ("get", "item-detail", "item", {"operator", "reviewer", "approver"}),
    ("post", "item-report", "item", {"reviewer"}),
    ("post", "compensation-reread", "compensation", {"reviewer", "approver"}),
    ("post", "compensation-propose-current", "compensation", {"reviewer", "approver"}),
    ("post", "compensation-accept", "compensation", {"reviewer", "approver"}),
    ("post", "records-accept", None, {"reviewer"}),
    ("post", "record-flag", "record", {"reviewer"}),
]


def _url(name: str, key: str | None, objects: dict) -> str:  # type: ignore[type-arg]
    if key is None:
        return reverse(name)
    arg = {"task": "task_id", "item": "item_id", "record": "record_id", "compensation": "compensation_id"}[key]
    return reverse(name, kwargs={arg: objects[key]})


@pytest.mark.parametrize(("method", "name", "key", "allowed"), ACTIONS, ids=[f"{m}-{n}" for m, n, _, _ in ACTIONS])
def test_anonymous_is_sent_to_the_login_page(objects, method, name, key, allowed):
    url = _url(name, key, objects)
    response = getattr(Client(), method)(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.parametrize(("method", "name", "key", "allowed"), ACTIONS, ids=[f"{m}-{n}" for m, n, _, _ in ACTIONS])
def test_anonymous_htmx_request_is_told_to_load_the_login_page(objects, method, name, key, allowed):
    response = getattr(Client(), method)(_url(name, key, objects), **htmx("summary"))
    assert response["HX-Redirect"].startswith(reverse("login"))


@pytest.mark.parametrize(("method", "name", "key", "allowed"), ACTIONS, ids=[f"{m}-{n}" for m, n, _, _ in ACTIONS])
def test_a_wrong_role_gets_403(as_user, objects, method, name, key, allowed):
    for person in {"operator", "reviewer", "approver"} - allowed:
        response = getattr(as_user(person), method)(_url(name, key, objects))
        assert response.status_code == 403, (person, name)


def test_a_person_without_any_role_gets_403_everywhere(objects, django_user_model):
    nobody = django_user_model.objects.create_user("nobody", password="nobody-pass-123")
    client = Client()
    client.force_login(nobody)
    for method, name, key, _ in ACTIONS:
        assert getattr(client, method)(_url(name, key, objects)).status_code == 403, name


@pytest.mark.parametrize(("method", "name", "key", "allowed"), ACTIONS, ids=[f"{m}-{n}" for m, n, _, _ in ACTIONS])
def test_the_right_role_is_let_in(as_user, objects, method, name, key, allowed):
    person = sorted(allowed)[0]
    data = {"password": f"{person}-pass-123"} if method == "post" else {}
    response = getattr(as_user(person), method)(_url(name, key, objects), data)
    assert response.status_code != 403, (person, name)
    assert not response.get("Location", "").startswith(reverse("login")), (person, name)


def test_login_page_signs_in_and_is_rate_limited(roles):
    client = Client()
    assert client.get(reverse("login")).status_code == 200
    for _ in range(5):
        assert client.post(reverse("login"), {"username": "operator", "password": "wrong"}).status_code == 200
    blocked = client.post(reverse("login"), {"username": "operator", "password": "operator-pass-123"})
    assert blocked.status_code == 429
    assert "_auth_user_id" not in client.session


def test_login_with_the_right_password_works(roles):
    client = Client()
    response = client.post(reverse("login"), {"username": "operator", "password": "operator-pass-123"})
    assert response.status_code == 302
    assert client.get(reverse("task-list")).status_code == 200
