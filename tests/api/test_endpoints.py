"""Every endpoint: happy path, missing or wrong token, another runtime's task, malformed body, unknown
id, illegal transition. Every refusal answers the documented status and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from stopdesk.models import Task, WorkItem
from stopdesk.services.items import task_create
from stopdesk.services.runtimes import runtime_revoke
from stopdesk.states import ItemState as S
from tests.api.conftest import ledger_counts
from tests.factories import make_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str  # {task} and {item} are filled in
    body: dict[str, Any] = field(default_factory=dict)
    state: str | None = None  # the item's state for the happy path
    status: int = 200
    illegal: str | None = None  # an item state from which the call is an illegal transition
    required: str | None = None  # a field whose absence is a 422

    def __str__(self) -> str:
        return self.name


ENDPOINTS = [
    Endpoint("create_task", "POST", "/tasks", {"title": "Analyse invoices"}, status=201, required="title"),
    Endpoint("get_task", "GET", "/tasks/{task}"),
    Endpoint(
        "register",
        "POST",
        "/tasks/{task}/items",
        {"kind": "local_worker", "noun": "draft"},
        status=201,
        required="kind",
    ),
    Endpoint("request_stop", "POST", "/tasks/{task}/stop", {"reason": "operator pressed Stop"}),
    Endpoint("get_item", "GET", "/items/{item}", state=S.QUEUED),
    Endpoint("start", "POST", "/items/{item}/start", {"worker": "w1"}, state=S.QUEUED, illegal=S.RUNNING),
    Endpoint("heartbeat", "POST", "/items/{item}/heartbeat", {"lease_seconds": 30}, state=S.RUNNING, illegal=S.QUEUED),
    Endpoint(
        "submit",
        "POST",
        "/items/{item}/submit",
        {"idempotency_key": "crm-1"},
        state=S.QUEUED,
        illegal=S.COMPLETED,
        required="idempotency_key",
    ),
    Endpoint(
        "attach_record",
        "POST",
        "/items/{item}/records",
        {
            "system": "crm",
            "record_id": "r-1",
            "effect": "created",
            "version": "3",
            "reversible": True,
            "reversal": "archive",
            "link": "https://crm.example.test/r-1",
        },
        state=S.RUNNING,
        status=201,
        illegal=S.QUEUED,
        required="record_id",
    ),
    Endpoint(
        "finish",
        "POST",
        "/items/{item}/finish",
        {"status": "completed", "detail": "done"},
        state=S.RUNNING,
        illegal=S.QUEUED,
        required="status",
    ),
    Endpoint(
        "mark_uncertain", "POST", "/items/{item}/uncertain", {"detail": "timeout"}, state=S.RUNNING, illegal=S.COMPLETED
    ),
    Endpoint(
        "cancel",
        "POST",
        "/items/{item}/cancel",
        {"detail": "stopped between steps"},
        state=S.RUNNING,
        illegal=S.COMPLETED,
    ),
    # The calls a framework run makes most, one request each.
    Endpoint(
        "register_started",
        "POST",
        "/tasks/{task}/items/started",
        {"kind": "local_worker", "noun": "lookup call", "handle": "call_1"},
        status=201,
        required="kind",
    ),
    Endpoint(
        "finish_fast",
        "POST",
        "/items/{item}/result",
        {"status": "completed", "detail": "done"},
        state=S.RUNNING,
        illegal=S.QUEUED,
        required="status",
    ),
    Endpoint("report_stopped", "POST", "/items/{item}/stopped", {"detail": "stopped by Stop"}, state=S.RUNNING),
    Endpoint(
        "record_launched",
        "POST",
        "/items/{item}/launched",
        {
            "calls": [
                {"type": "mcp_call", "call_id": "mcp_1", "server_label": "crm", "tool": "create", "status": "calling"}
            ]
        },
        state=S.RUNNING,
        required="calls",
    ),
    Endpoint("task_settle_check", "POST", "/tasks/{task}/settle"),
]
POSTS = [e for e in ENDPOINTS if e.method == "POST"]
WITH_IDS = [e for e in ENDPOINTS if "{" in e.path]


def _path(endpoint: Endpoint, runtime, *, state: str | None = None) -> str:  # type: ignore[no-untyped-def]
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime)
    item = make_item(task, state=state or endpoint.state or S.QUEUED)
    return endpoint.path.format(task=task.pk, item=item.pk)


def _call(api, endpoint: Endpoint, path: str, **kw):  # type: ignore[no-untyped-def]
    if endpoint.method == "GET":
        return api.get(path, **kw)
    return api.post(path, kw.pop("body", endpoint.body), **kw)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_happy_path_answers_the_documented_status(api, runtime, endpoint):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = _call(api, endpoint, path)
    assert answer.status == endpoint.status, answer.body
    assert isinstance(answer.body, dict) and "error" not in answer.body
    if endpoint.method == "GET":
        assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
@pytest.mark.parametrize("token", [None, "sd_not-a-token", "Basic abc"], ids=["missing", "wrong", "not-bearer"])
def test_without_a_valid_token_it_is_401_and_writes_nothing(api, runtime, endpoint, token):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    headers = {"Authorization": token} if token and token.startswith("Basic") else None
    answer = _call(api, endpoint, path, token=None if headers else token, headers=headers)
    assert answer.status == 401 and answer.body["error"] == "unauthorized"
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_a_revoked_token_is_refused(api, runtime, endpoint):
    path = _path(endpoint, runtime[0])
    runtime_revoke(runtime=runtime[0], actor="test")
    before = ledger_counts()
    assert _call(api, endpoint, path).status == 401
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", WITH_IDS, ids=str)
def test_another_runtimes_task_is_404_not_403(other_api, runtime, endpoint):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = _call(other_api, endpoint, path)
    assert answer.status == 404 and answer.body["error"] == "not_found"
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", WITH_IDS, ids=str)
@pytest.mark.parametrize("bad_id", ["999999", "abc", "0", "-1", "99999999999999999999", "1e3"])
def test_an_unknown_id_is_404_and_writes_nothing(api, runtime, endpoint, bad_id):
    _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = _call(api, endpoint, endpoint.path.format(task=bad_id, item=bad_id))
    assert answer.status == 404 and answer.body["error"] == "not_found"
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", POSTS, ids=str)
@pytest.mark.parametrize("raw", ['{"title": ', "[1, 2]", "NaN", '"text"', "\xff\xfe", "[" * 5000 + "]" * 5000])
def test_a_malformed_body_is_400_and_writes_nothing(api, runtime, endpoint, raw):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = api.post(path, raw=raw.encode("latin-1"))
    assert answer.status == 400 and answer.body["error"] == "malformed_json", answer.body
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", [e for e in POSTS if e.required], ids=str)
def test_a_missing_field_is_422_naming_it(api, runtime, endpoint):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    body = {k: v for k, v in endpoint.body.items() if k != endpoint.required}
    answer = api.post(path, body)
    assert answer.status == 422, answer.body
    assert answer.body == {
        "error": "missing_field",
        "detail": f"{endpoint.required} is required.",
        "field": endpoint.required,
    }
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", POSTS, ids=str)
@pytest.mark.parametrize(
    ("extra", "field_name"),
    [({"unexpected": 1}, "unexpected"), ({"lease_seconds": "ten"}, "lease_seconds"), ({"detail": "\x00"}, "detail")],
    ids=["unknown-field", "wrong-type", "nul"],
)
def test_an_invalid_field_is_422_naming_it(api, runtime, endpoint, extra, field_name):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = api.post(path, {**endpoint.body, **extra})
    assert answer.status == 422, answer.body
    assert answer.body["field"] in (field_name, "unexpected") or answer.body["error"] == "unknown_field"
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", POSTS, ids=str)
def test_an_oversize_body_is_refused_with_413(api, runtime, endpoint):
    path = _path(endpoint, runtime[0])
    before = ledger_counts()
    answer = api.post(path, {**endpoint.body, "label": "x" * 70_000})
    assert answer.status == 413 and answer.body["error"] == "body_too_large"
    assert ledger_counts() == before


@pytest.mark.parametrize("endpoint", [e for e in ENDPOINTS if e.illegal], ids=str)
def test_an_illegal_transition_is_409_naming_the_current_state(api, runtime, endpoint):
    path = _path(endpoint, runtime[0], state=endpoint.illegal)
    before = ledger_counts()
    answer = api.post(path, endpoint.body)
    assert answer.status == 409, answer.body
    assert answer.body["error"] == "illegal_transition" and answer.body["state"] == endpoint.illegal
    assert endpoint.illegal in answer.body["detail"]
    assert ledger_counts() == before


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_a_wrong_method_is_405_with_allow(api, runtime, method):
    answer = api.call(method, "/tasks")
    assert answer.status == 405 and answer.body["error"] == "method_not_allowed" and answer.headers["Allow"] == "POST"


def test_an_unknown_path_is_a_json_404(api):
    answer = api.get("/nowhere/at/all")
    assert answer.status == 404 and answer.body["error"] == "not_found"


def test_a_created_task_belongs_to_the_runtime(api, runtime):
    answer = api.post("/tasks", {"title": "Analyse invoices"})
    assert Task.objects.get(pk=answer.body["id"]).runtime == runtime[0]


def test_a_parent_from_another_task_is_422(api, runtime):
    theirs = make_item(task_create(title="other", actor="test", runtime=runtime[0]))
    mine = task_create(title="mine", actor="test", runtime=runtime[0])
    before = ledger_counts()
    answer = api.post(f"/tasks/{mine.pk}/items", {"kind": "local_worker", "noun": "draft", "parent": theirs.pk})
    assert answer.status == 422 and answer.body["field"] == "parent"
    assert ledger_counts() == before
    ok = api.post(f"/tasks/{theirs.task_id}/items", {"kind": "remote_tool", "noun": "call", "parent": theirs.pk})
    assert ok.status == 201 and ok.body["parent"] == theirs.pk
    assert WorkItem.objects.get(pk=ok.body["id"]).parent_id == theirs.pk


def test_an_unknown_mechanism_is_refused_at_registration(api, runtime):
    # Before, a mechanism no adapter handles silently became "manual": Stop could never cancel it.
    task = task_create(title="Analyse invoices", actor="test", runtime=runtime[0])
    before = ledger_counts()
    answer = api.post(f"/tasks/{task.pk}/items", {"kind": "remote_tool", "noun": "call", "mechanism": "telnet"})
    assert answer.status == 422, answer.body
    assert (answer.body["error"], answer.body["field"]) == ("unknown_mechanism", "mechanism")
    assert "telnet" in answer.body["detail"] and "openai" in answer.body["detail"]
    assert ledger_counts() == before
