"""What the endpoints mean: the boundary after Stop, idempotent Stop, replays with Idempotency-Key,
late results, and the task read-out."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from stopdesk.models import ApiIdempotency, Event, ExternalRecord, Runtime, Task, WorkItem
from stopdesk.services.items import task_create
from stopdesk.states import ItemState as S
from tests.api.conftest import Api, ledger_counts
from tests.factories import make_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


@pytest.fixture
def task(runtime):  # type: ignore[no-untyped-def]
    return task_create(title="Analyse invoices", actor="test", runtime=runtime[0])


def _stop(api, task):  # type: ignore[no-untyped-def]
    return api.post(f"/tasks/{task.pk}/stop", {"reason": "operator"})


@pytest.mark.parametrize("verb", ["start", "submit"])
def test_after_stop_the_boundary_answers_409_task_stopped_and_the_item_is_cancelled(api, task, verb):
    item = make_item(task)
    late = make_item(task)
    _stop(api, task)
    # Registered after Stop: still queued, so the refusal is the boundary's own.
    registered = api.post(f"/tasks/{task.pk}/items", {"kind": "external_operation", "noun": "email"}).body
    for item_id in (item.pk, late.pk, registered["id"]):
        # With an Idempotency-Key too, as the client always sends one: the cancellation still commits.
        answer = api.post(
            f"/items/{item_id}/{verb}",
            {"idempotency_key": "mail-1"} if verb == "submit" else {},
            headers={"Idempotency-Key": f"{verb}-{item_id}"} if item_id != item.pk else None,
        )
        assert answer.status == 409 and answer.body["error"] == "task_stopped", answer.body
        assert answer.body["item"] == item_id
        assert WorkItem.objects.get(pk=item_id).state == S.CANCELLED
    assert Event.objects.filter(item_id=registered["id"], kind="boundary_refused").count() == 1


def test_heartbeat_answers_whether_stop_was_requested(api, task):
    item = make_item(task, state=S.RUNNING)
    assert api.post(f"/items/{item.pk}/heartbeat").body["stop_requested"] is False
    _stop(api, task)
    beat = api.post(f"/items/{item.pk}/heartbeat")
    assert beat.status == 200 and beat.body["stop_requested"] is True and beat.body["state"] == S.RUNNING
    # The cooperative worker stops between steps and says so.
    cancelled = api.post(f"/items/{item.pk}/cancel", {"detail": "stopped between steps"})
    assert cancelled.body["state"] == S.CANCELLED and cancelled.body["outcome"] == "stopped between steps"
    again = api.post(f"/items/{item.pk}/heartbeat")
    assert again.status == 409 and again.body["error"] == "task_stopped"


def test_stop_is_idempotent_and_returns_the_same_stop_request(api, task):
    make_item(task)
    first, second = _stop(api, task), _stop(api, task)
    assert first.status == second.status == 200
    assert first.body["created"] is True and second.body["created"] is False
    assert first.body["requested_at"] == second.body["requested_at"] and second.body["duplicates"] == 1
    assert first.body["queued_cancelled"] == 1


def test_replaying_a_create_with_the_same_key_returns_the_first_item(api, task):
    body = {"kind": "model_request", "noun": "draft"}
    first = api.post(f"/tasks/{task.pk}/items", body, headers={"Idempotency-Key": "reg-1"})
    before = ledger_counts()
    second = api.post(f"/tasks/{task.pk}/items", body, headers={"Idempotency-Key": "reg-1"})
    assert first.status == second.status == 201 and first.body == second.body
    assert ledger_counts() == before
    other = api.post(f"/tasks/{task.pk}/items", body, headers={"Idempotency-Key": "reg-2"})
    assert other.body["id"] != first.body["id"]


def test_replaying_a_task_create_with_the_same_key_creates_one_task(api):
    answers = [api.post("/tasks", {"title": "t"}, headers={"Idempotency-Key": "t-1"}) for _ in range(3)]
    assert len({a.body["id"] for a in answers}) == 1 and Task.objects.count() == 1


def test_the_same_key_from_another_runtime_is_its_own(api, other_api):
    mine = api.post("/tasks", {"title": "t"}, headers={"Idempotency-Key": "same"})
    theirs = other_api.post("/tasks", {"title": "t"}, headers={"Idempotency-Key": "same"})
    assert mine.body["id"] != theirs.body["id"]


def test_a_replayed_start_returns_the_first_answer_instead_of_409(api, task):
    item = make_item(task)
    first = api.post(f"/items/{item.pk}/start", {}, headers={"Idempotency-Key": "s-1"})
    events = Event.objects.count()
    second = api.post(f"/items/{item.pk}/start", {}, headers={"Idempotency-Key": "s-1"})
    assert first.status == second.status == 200 and first.body == second.body
    assert Event.objects.count() == events


def test_a_refused_request_is_not_remembered_under_its_key(api, task):
    item = make_item(task, state=S.COMPLETED)
    answer = api.post(f"/items/{item.pk}/cancel", {}, headers={"Idempotency-Key": "c-1"})
    assert answer.status == 409 and ApiIdempotency.objects.count() == 0


def test_an_oversize_idempotency_key_is_422(api):
    answer = api.post("/tasks", {"title": "t"}, headers={"Idempotency-Key": "k" * 201})
    assert answer.status == 422 and answer.body["field"] == "Idempotency-Key" and Task.objects.count() == 0


def test_a_late_result_after_stop_is_an_event_not_an_overwrite(api, task):
    item = make_item(task, state=S.RUNNING)
    _stop(api, task)
    api.post(f"/items/{item.pk}/cancel")
    answer = api.post(f"/items/{item.pk}/finish", {"status": "completed", "detail": "finished anyway"})
    assert answer.status == 200 and answer.body["state"] == S.CANCELLED and answer.body["needs_review"] is True
    assert Event.objects.filter(item=item, kind="late_result").count() == 1


def test_an_external_action_records_its_key_and_its_record(api, task):
    item = api.post(f"/tasks/{task.pk}/items", {"kind": "external_operation", "noun": "record"}).body
    submitted = api.post(f"/items/{item['id']}/submit", {"idempotency_key": "crm-create-1"}).body
    assert submitted["state"] == S.RUNNING and submitted["idempotency_key"] == "crm-create-1"
    record = api.post(
        f"/items/{item['id']}/records",
        {
            "system": "crm",
            "record_id": "C-1",
            "effect": "created",
            "version": "v1",
            "reversible": True,
            "reversal": "archive",
        },
    )
    assert record.status == 201 and record.body["version"] == "v1"
    updated = api.post(
        f"/items/{item['id']}/records",
        {"system": "crm", "record_id": "C-1", "effect": "created", "version": "v2", "reversible": True},
    )
    assert updated.body["id"] == record.body["id"] and ExternalRecord.objects.get().version == "v2"
    api.post(f"/items/{item['id']}/finish", {"status": "completed"})
    api.post(f"/tasks/{task.pk}/close", {})
    detail = api.get(f"/tasks/{task.pk}").body
    assert detail["counts"][S.COMPLETED] == 1 and detail["summary"] == "Finished. One record created."


def test_an_uncertain_item_gets_an_investigate_by_deadline(api, task):
    item = make_item(task, state=S.RUNNING)
    answer = api.post(f"/items/{item.pk}/uncertain", {"detail": "CRM timed out", "evidence": {"timeout_s": 10}})
    assert answer.body["state"] == S.UNCERTAIN and answer.body["investigate_by"] is not None
    # The detail is also the reason every uncertain item carries.
    assert answer.body["evidence"] == {"timeout_s": 10, "uncertain_because": "CRM timed out"}


def test_the_task_read_out_has_counts_items_and_the_summary(api, task):
    for _ in range(2):
        make_item(task, noun="draft")
    make_item(task, noun="draft", state=S.COMPLETED)
    _stop(api, task)
    detail = api.get(f"/tasks/{task.pk}").body
    assert detail["counts"] == {**dict.fromkeys(S.values, 0), S.CANCELLED: 2, S.COMPLETED: 1}
    assert [i["state"] for i in detail["items"]] == [S.CANCELLED, S.CANCELLED, S.COMPLETED]
    assert detail["stopped"] is True and detail["summary"].startswith("Stopped new work.")


def test_the_openapi_document_is_served_and_names_every_endpoint(api):
    doc = api.get("/openapi.json", token=None).body
    assert doc["openapi"].startswith("3.1")
    operations = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert operations == {
        "create_task",
        "get_task",
        "register",
        "request_stop",
        "close_task",
        "get_item",
        "start",
        "heartbeat",
        "submit",
        "attach_record",
        "finish",
        "mark_uncertain",
        "cancel",
        "watch_stop",
        "watch_stop_many",
        "record_handle",
        "register_started",
        "finish_fast",
        "write_results",
        "report_stopped",
        "record_launched",
        "task_settle_check",
        "note_evidence",
    }
    assert doc["paths"]["/items/{item_id}/start"]["post"]["responses"]["409"]
    watch = doc["paths"]["/tasks/{task_id}/stop/watch"]["get"]
    assert watch["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/StopWatchInfo")
    assert "StopWatchInfo" in doc["components"]["schemas"]


def test_the_management_commands_issue_a_working_token_and_revoke_it(capsys):
    call_command("create_runtime_token", "cli-agent", "--quiet")
    token = capsys.readouterr().out.strip()
    runtime = Runtime.objects.get(name="cli-agent")
    assert (
        token.startswith("sd_")
        and runtime.token_hash == Runtime.hash_token(token)
        and token not in str(Runtime.objects.values_list())
    )
    assert Api(token).post("/tasks", {"title": "t"}).status == 201
    call_command("revoke_runtime_token", "cli-agent")
    assert Api(token).post("/tasks", {"title": "t"}).status == 401
    call_command("create_runtime_token", "cli-agent", "--rotate", "--quiet")
    fresh = capsys.readouterr().out.strip().splitlines()[-1]
    assert Api(fresh).post("/tasks", {"title": "t"}).status == 201 and Api(token).get("/tasks/1").status == 401
    assert Event.objects.filter(kind__in=["runtime_token_issued", "runtime_token_revoked"]).count() == 3


def test_creating_a_runtime_in_the_admin_shows_its_token_once(client, cast):
    client.force_login(cast["admin"])
    response = client.post("/admin/stopdesk/runtime/add/", {"name": "admin-made"}, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"] if "shown once" in str(m)]
    assert len(shown) == 1
    token = shown[0].rsplit(" ", 1)[-1]
    assert Runtime.objects.get(name="admin-made").token_hash == Runtime.hash_token(token)
    assert Api(token).post("/tasks", {"title": "t"}).status == 201
    page = client.get("/admin/stopdesk/runtime/")
    assert token not in page.content.decode()


def test_a_handle_is_recorded_after_dispatch_only_for_work_that_passed_the_boundary(api, task):
    queued = make_item(task, noun="draft")
    refused = api.post(f"/items/{queued.pk}/handle", {"handle": "resp_1"})
    assert refused.status == 409 and refused.body["error"] == "illegal_transition"
    queued.refresh_from_db()
    assert queued.handle == ""
    running = make_item(task, noun="draft", state=S.RUNNING)
    answer = api.post(f"/items/{running.pk}/handle", {"handle": "resp_2", "detail": {"openai": {"model": "m"}}})
    assert answer.status == 200 and answer.body["handle"] == "resp_2"
    assert answer.body["detail"]["openai"] == {"model": "m"}
    again = api.post(f"/items/{running.pk}/handle", {"handle": "resp_2"})
    assert again.status == 200
    other = api.post(f"/items/{running.pk}/handle", {"handle": "resp_3"})
    assert other.status == 409 and (other.body["error"], other.body["field"]) == ("handle_conflict", "handle")
    assert Event.objects.filter(item=running, kind="handle_recorded").count() == 1


def test_a_handle_recorded_after_stop_makes_the_item_due_for_its_cancel_at_once(api, task):
    running = make_item(task, noun="draft", state=S.RUNNING)
    _stop(api, task)
    running.refresh_from_db()
    assert running.cancel_requested_at is not None
    WorkItem.objects.filter(pk=running.pk).update(next_check_at=None)
    answer = api.post(f"/items/{running.pk}/handle", {"handle": "resp_late"})
    assert answer.status == 200
    running.refresh_from_db()
    assert running.handle == "resp_late" and running.next_check_at is not None
