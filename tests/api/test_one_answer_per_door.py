"""One answer per question, whatever the door: the runtime API and the dashboard (and, for the
runtime's own questions, the in-process runtime and both clients) answer alike."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.auth.models import Group
from django.test import Client as DjangoClient

from stopdesk.agent.runtime import LocalRuntime
from stopdesk.client import AsyncClient, Client, StopRequested, TaskClosed
from stopdesk.models import Runtime, StopRequest, Task
from stopdesk.permissions import roles_ensure
from stopdesk.services.closing import task_close
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import Kind
from tests.api.conftest import Api, ledger_counts

pytestmark = pytest.mark.django_db
REGISTER = {"kind": Kind.EXTERNAL_OPERATION, "noun": "vendor"}


@pytest.fixture
def dashboard(cast) -> DjangoClient:  # type: ignore[no-untyped-def]
    roles_ensure()
    cast["operator"].groups.add(Group.objects.get(name="operators"))
    client = DjangoClient()
    client.force_login(cast["operator"])
    return client


def _settled_task(api: Api) -> int:
    """A task of the runtime whose one item finished: settled, not closed."""
    task_id = api.post("/tasks", {"title": "Vendor bank details"}).body["id"]
    item = api.post(f"/tasks/{task_id}/items", REGISTER).body["id"]
    api.post(f"/items/{item}/submit", {"idempotency_key": "vendor-1"})
    api.post(f"/items/{item}/finish", {"status": "completed"})
    api.post(f"/tasks/{task_id}/settle", {})
    task = Task.objects.get(pk=task_id)
    assert task.settled_at is not None and task.closed_at is None
    return task_id


def _stop_by_api(api: Api, task_id: int, reason: str) -> int:
    return api.post(f"/tasks/{task_id}/stop", {"reason": reason}).status


def _stop_by_dashboard(dashboard: DjangoClient, task_id: int, reason: str) -> int:
    return dashboard.post(f"/tasks/{task_id}/stop/", {"reason": reason}).status_code


@pytest.mark.parametrize("first", ["api", "dashboard"])
def test_stop_on_a_settled_task_is_recorded_whichever_door_comes_first(api, dashboard, first):
    task_id = _settled_task(api)
    doors = {
        "api": lambda reason: _stop_by_api(api, task_id, reason),
        "dashboard": lambda reason: _stop_by_dashboard(dashboard, task_id, reason),
    }
    second = "dashboard" if first == "api" else "api"
    assert doors[first]("first reason") in (200, 302)
    assert doors[second]("second reason") in (200, 302)
    stop = StopRequest.objects.get(task_id=task_id)
    assert stop.reason == "first reason" and stop.duplicates == 1
    # Recorded the same way through either door: the next registration cannot start.
    item = api.post(f"/tasks/{task_id}/items", REGISTER).body
    assert item["state"] == "cancelled"
    refused = api.post(f"/items/{item['id']}/submit", {"idempotency_key": "vendor-2"})
    assert refused.status == 409 and refused.body["error"] == "task_stopped"


@pytest.mark.parametrize("door", ["api", "dashboard"])
def test_stop_on_a_closed_task_is_recorded_by_every_door(api, dashboard, door):
    task_id = _settled_task(api)
    task_close(task_id=task_id, actor="runtime:test")
    status = _stop_by_api(api, task_id, "late") if door == "api" else _stop_by_dashboard(dashboard, task_id, "late")
    assert status in (200, 302)
    assert StopRequest.objects.get(task_id=task_id).reason == "late"


def test_the_dashboard_and_the_api_agree_on_a_stop_through_htmx(api, dashboard):
    task_id = _settled_task(api)
    answer = dashboard.post(
        f"/tasks/{task_id}/stop/",
        {"reason": "from the page"},
        headers={"HX-Request": "true", "HX-Target": "stop-action"},
    )
    assert answer.status_code == 200
    stop = api.post(f"/tasks/{task_id}/stop", {"reason": "from the agent's operator"}).body
    assert stop["created"] is False and stop["reason"] == "from the page"


def test_registration_on_a_closed_task_is_refused_alike_by_the_api_and_in_process(api):
    task_id = _settled_task(api)
    closed = api.post(f"/tasks/{task_id}/close", {"reason": "all vendors done"})
    assert closed.status == 200 and closed.body["closed"] is True and closed.body["closed_at"]
    before = ledger_counts()
    refused = api.post(f"/tasks/{task_id}/items", REGISTER)
    assert refused.status == 409 and refused.body["error"] == "task_closed" and refused.body["task"] == task_id
    started = api.post(f"/tasks/{task_id}/items/started", {**REGISTER, "submit_key": "vendor-9"})
    assert started.status == 409 and started.body["error"] == "task_closed"
    with pytest.raises(TaskClosed) as local:
        LocalRuntime(runtime=Runtime.objects.get()).register(task_id, **REGISTER)
    assert local.value.code == "task_closed" and local.value.detail == refused.body["detail"]
    assert ledger_counts() == before


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive_at_the_api_and_at_metrics(api, settings, scheme):
    settings.STOPDESK_METRICS_TOKEN = "scrape-token"
    runtime = api.get("/tasks/1", token=None, headers={"Authorization": f"{scheme} {api.token}"})
    assert runtime.status == 404  # authenticated: there is just no task 1
    metrics = DjangoClient().get("/metrics", headers={"Authorization": f"{scheme} scrape-token"})
    assert metrics.status_code == 200


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic c2NyYXBlLXRva2Vu", "Bearer"])
def test_a_refused_token_gets_one_error_shape_at_the_api_and_at_metrics(api, settings, authorization):
    settings.STOPDESK_METRICS_TOKEN = "scrape-token"
    headers = {"Authorization": authorization} if authorization else {}
    runtime = api.get("/tasks/1", token=None, headers=headers)
    metrics = DjangoClient().get("/metrics", headers=headers)
    assert runtime.status == metrics.status_code == 401
    assert metrics["Content-Type"] == "application/json"
    body = metrics.json()
    assert set(body) == set(runtime.body) == {"error", "detail"}
    assert body["error"] == runtime.body["error"] == "unauthorized"
    assert runtime.headers["WWW-Authenticate"].startswith("Bearer ")
    assert metrics["WWW-Authenticate"].startswith("Bearer ")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_both_clients_close_the_task_and_are_refused_alike_after(live_server):
    token = runtime_create(name="closing-agent", actor="test")[1]
    with Client(live_server.url, token, timeout=5) as sd:
        task = sd.create_task("Closed by its runtime")
        sd.register(task.id, **REGISTER)
        info = sd.close_task(task.id, reason="done")
        assert info.closed and info.closed_at is not None
        assert sd.close_task(task.id).closed_at == info.closed_at  # idempotent
        with pytest.raises(TaskClosed):
            sd.register(task.id, **REGISTER)

    async def run() -> None:
        async with AsyncClient(live_server.url, token, timeout=5) as sd:
            task = await sd.create_task("Closed by its async runtime")
            info = await sd.close_task(task.id)
            assert info.closed
            with pytest.raises(TaskClosed):
                await sd.register(task.id, **REGISTER)
            # A closed task ends an agent loop that ends on Stop: TaskClosed is a StopRequested.
            with pytest.raises(StopRequested):
                await sd.register(task.id, **REGISTER)

    asyncio.run(run())


def test_a_too_long_reason_is_refused_whole_by_both_doors_and_writes_nothing(api, dashboard):
    task_id = api.post("/tasks", {"title": "Long reasons"}).body["id"]
    reason = "x" * 2001
    by_api = api.post(f"/tasks/{task_id}/stop", {"reason": reason})
    assert by_api.status == 422 and by_api.body["field"] == "reason"
    by_page = dashboard.post(f"/tasks/{task_id}/stop/", {"reason": reason})
    assert by_page.status_code == 400
    html = by_page.content.decode()
    assert "at most 2,000 are kept" in html and 'aria-invalid="true"' in html and reason in html
    assert not StopRequest.objects.filter(task_id=task_id).exists()
    # At the limit, both doors keep it whole.
    assert dashboard.post(f"/tasks/{task_id}/stop/", {"reason": "y" * 2000}).status_code == 302
    assert StopRequest.objects.get(task_id=task_id).reason == "y" * 2000


def test_closing_answers_alike_in_process_and_over_the_api(api):
    local = LocalRuntime(runtime=Runtime.objects.get())
    in_process = _settled_task(api)
    over_http = _settled_task(api)
    closed_here = local.close_task(in_process, reason="done").to_json()
    closed_there = api.post(f"/tasks/{over_http}/close", {"reason": "done"}).body
    assert closed_here["closed"] is closed_there["closed"] is True
    assert set(closed_here) == set(closed_there)
    # Idempotent at both doors: the second close changes nothing.
    assert local.close_task(in_process).to_json()["closed_at"] == closed_here["closed_at"]
    assert api.post(f"/tasks/{over_http}/close", {}).body["closed_at"] == closed_there["closed_at"]
    # Another runtime's task is not found, whichever door.
    assert api.post("/tasks/999999/close", {}).status == 404
