"""The runtime API on whichever database the suite runs with: PostgreSQL (`make test`) and the
zero-setup default, SQLite (`make test-sqlite` runs this file too). A framework run over HTTP sends
an Idempotency-Key with every registration; the first answer is stored, a repeat gets it back."""

from __future__ import annotations

from stopdesk.models import ApiIdempotency, WorkItem
from tests.api.conftest import Api

CALL = {"kind": "local_worker", "noun": "lookup call", "handle": "call_1"}


def test_a_keyed_registration_is_answered_once_and_a_repeat_gets_the_first_answer(api: Api):
    task_id = api.post("/tasks", {"title": "Look Acme up"}).body["id"]
    path = f"/tasks/{task_id}/items/started"
    first = api.call("POST", path, CALL, headers={"Idempotency-Key": "call-1"})
    again = api.call("POST", path, CALL, headers={"Idempotency-Key": "call-1"})
    assert (first.status, again.status) == (201, 201) and first.body == again.body
    item = WorkItem.objects.get(pk=first.body["id"])
    assert (item.task_id, item.state, item.handle) == (task_id, "running", "call_1")
    assert ApiIdempotency.objects.filter(key="call-1").count() == 1
    assert WorkItem.objects.filter(task_id=task_id).count() == 1
