"""The agent door: the registration before each tool call, served on the watch server's event loop
(`stopdesk.api.agent_door`) instead of by Django. The watch server runs for real here (uvicorn on
loopback serving `stopdesk.asgi`, in this process), the web door through Django's test client.

The same request gets the same answer at both doors, and writes the same rows; a plain
registration is the door's own (no Django request), every other case is Django's, in the same
process."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.core.signals import request_started
from django.db import connection

from stopdesk.api import agent_door
from stopdesk.client import AsyncClient, Client
from stopdesk.models import ApiIdempotency, Event, Runtime, Task, WorkItem
from stopdesk.services.closing import task_close
from stopdesk.services.items import item_register, item_register_started, item_report_stopped, task_create
from stopdesk.services.runtimes import runtime_create, runtime_revoke, runtime_rotate
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_close_running
from stopdesk.states import ItemState
from tests.api.conftest import Api, ledger_counts
from tests.api.watching import NO_DISPATCH, watch_server_running

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ItemState
CALL = {"kind": "local_worker", "noun": "lookup call", "handle": "call_1", "label": "lookup"}


@pytest.fixture
def door() -> Iterator[str]:
    with watch_server_running() as url:
        yield url


class DjangoRequests:
    """How many requests Django itself served (its request_started signal), from any thread."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, **_: Any) -> None:
        with self._lock:
            self.count += 1


@pytest.fixture
def django_requests() -> Iterator[DjangoRequests]:
    seen = DjangoRequests()
    request_started.connect(seen, weak=False)
    yield seen
    request_started.disconnect(seen)


@dataclass
class Case:
    """A registration request, made against a fresh task of its own (`setup` may change it)."""

    name: str
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] | None = None
    token: str | None = "runtime"  # "runtime": the runtime's own token; None: no header
    task: str | None = None  # the path's task id when not the fresh task's
    setup: Callable[[int, Any], None] | None = None
    served_by_door: bool = False  # answered without a Django request


def _stopped(task_id: int, _: Any) -> None:
    task_request_stop(task_id=task_id, actor="user:operator", **NO_DISPATCH)


def _closed(task_id: int, _: Any) -> None:
    task_close(task_id=task_id, actor="runtime:test")


def _steering() -> dict[str, Any]:
    return {**CALL, "mechanism": "http", "detail": {"http": {"system": "crm", "url": "http://127.0.0.1:1/x"}}}


CASES = [
    Case("plain", CALL, served_by_door=True),
    Case("submitted", {**CALL, "kind": "external_operation", "submit_key": "send-1"}, served_by_door=True),
    Case("keyed", CALL, headers={"Idempotency-Key": "k-plain"}, served_by_door=True),
    Case("with a lease and a worker", {**CALL, "lease_seconds": 90, "worker": "w-1"}, served_by_door=True),
    Case("no token", CALL, token=None, served_by_door=True),
    Case("a wrong token", CALL, token="sd_wrong", served_by_door=True),
    Case("not a task id", CALL, task="abc", served_by_door=True),
    Case("a long Idempotency-Key", CALL, headers={"Idempotency-Key": "k" * 201}, served_by_door=True),
    Case("not JSON", raw=b"{nope", served_by_door=True),
    Case("not an object", raw=b"[1, 2]", served_by_door=True),
    Case("too large", raw=json.dumps({**CALL, "label": "x" * 70_000}).encode(), served_by_door=True),
    Case("no noun", {"kind": "local_worker"}, served_by_door=True),
    Case("an unknown field", {**CALL, "colour": "red"}, served_by_door=True),
    Case("an unknown kind", {**CALL, "kind": "spell"}, served_by_door=True),
    Case("an unknown mechanism", {**CALL, "mechanism": "carrier-pigeon"}),
    Case("a declaration that steers", _steering()),
    Case("no such task", CALL, task="999999"),
    Case("another runtime's task", CALL, task="other"),
    Case("a stopped task", CALL, setup=_stopped),
    Case("a closed task", CALL, setup=_closed),
    Case("a parent of the same task", {**CALL, "parent": "same"}),
    Case("a parent of another task", {**CALL, "parent": "elsewhere"}),
]


def _send(case: Case, where: str, api: Api, door: str, token: str, other_task: int) -> tuple[int, Any, int]:
    """The case at one door: (status, body, the fresh task's id)."""
    task = task_create(title=f"{case.name} at {where}", actor="test", runtime=api.runtime)
    if case.setup is not None:
        case.setup(task.pk, api)
    body = case.body
    if isinstance(body, dict) and body.get("parent") in ("same", "elsewhere"):
        owner = task.pk if body["parent"] == "same" else Task.objects.exclude(pk=task.pk).first().pk
        parent = item_register(task=owner, actor="test", kind="local_worker", noun="agent run")
        body = {**body, "parent": parent.pk}
    task_id = {"other": str(other_task), None: str(task.pk)}.get(case.task, case.task)
    authorization = {"runtime": token, None: None}.get(case.token, case.token)  # type: ignore[arg-type]
    raw = case.raw if case.raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **(case.headers or {})}
    if authorization is not None:
        headers["Authorization"] = f"Bearer {authorization}"
    path = f"/tasks/{task_id}/items/started"
    if where == "web":
        answer = api.call("POST", path, raw=raw, token=None, headers=headers)
        return answer.status, answer.body, task.pk
    response = httpx.post(door + path, content=raw, headers=headers, timeout=30)
    return response.status_code, response.json(), task.pk


def _alike(body: Any, task_id: int, items: dict[int, str] | None = None, key: str = "") -> Any:
    """The answer with its ids written as names, so both doors' answers compare: a task's id as
    <task> (or <another task>), an item's by its name in `items`, or <id>."""
    if isinstance(body, dict):
        return {k: _alike(value, task_id, items, k) for k, value in body.items()}
    if isinstance(body, list):
        return [_alike(value, task_id, items, key) for value in body]
    if isinstance(body, bool):
        return body
    if isinstance(body, int):
        if key == "task":
            return "<task>" if body == task_id else "<another task>"
        return (items or {}).get(body, "<id>")
    if isinstance(body, str):
        return re.sub(r"\b\d+\b", "<id>", body.replace(f"Task {task_id} ", "Task <task> "))
    return body


def _items(task_id: int) -> list[tuple[str, str, list[str]]]:
    return [
        (item.noun, item.state, sorted(Event.objects.filter(item=item).values_list("kind", flat=True)))
        for item in WorkItem.objects.filter(task_id=task_id).exclude(noun="agent run").order_by("pk")
    ]


@pytest.fixture
def web_api(runtime_token) -> Api:  # type: ignore[no-untyped-def]
    api = Api(runtime_token[1])
    api.runtime = runtime_token[0]  # type: ignore[attr-defined]
    return api


def test_every_request_gets_the_same_answer_and_writes_the_same_rows_at_both_doors(door, web_api, django_requests):
    other, _ = runtime_create(name="someone-else", actor="test")
    other_task = task_create(title="theirs", actor="test", runtime=other).pk
    for case in CASES:
        answers = {}
        for where in ("web", "door"):
            before = ledger_counts()
            seen = django_requests.count
            status, body, task_id = _send(case, where, web_api, door, web_api.token, other_task)
            written = {name: n - before[name] for name, n in ledger_counts().items()}
            answers[where] = (status, _alike(body, task_id), written, _items(task_id))
            if where == "door":
                served_here = django_requests.count == seen
                assert served_here == case.served_by_door, (case.name, status, body)
        assert answers["door"] == answers["web"], case.name


@dataclass
class ResultCase:
    """Results sent for the items of a fresh task: its run (`run`, running) and a tool call
    (`call`, running unless `setup` changes it). `body` and `path` name them by those words."""

    name: str
    body: Callable[[dict[str, int]], Any]
    path: str = "/results"
    setup: Callable[[dict[str, int]], None] | None = None
    token: str | None = "runtime"
    served_by_door: bool = False


def _one(status: str = "completed", **extra: Any) -> Callable[[dict[str, int]], Any]:
    return lambda ids: {"results": [{"item": ids["call"], "status": status, "detail": "12 rows", **extra}]}


def _held(ids: dict[str, int]) -> dict[str, Any]:
    return {"results": [{"item": ids["call"], "status": "completed", "detail": "12 rows", "open_item": ids["run"]}]}


def _finished(ids: dict[str, int]) -> None:
    item_close_running(item_id=ids["call"], succeeded=True, actor="test", outcome="first")


def _stop_pressed(ids: dict[str, int]) -> None:
    task_request_stop(task_id=ids["task"], actor="user:operator", **NO_DISPATCH)


def _cancelled(ids: dict[str, int]) -> None:
    _stop_pressed(ids)
    item_report_stopped(item_id=ids["call"], actor="test")


RESULT_CASES = [
    ResultCase("a result with its run open", _held, served_by_door=True),
    ResultCase(
        "two results with their run open",
        lambda ids: {
            "results": [
                {"item": ids["call"], "status": "failed", "detail": "boom", "open_item": ids["run"]},
                {"item": ids["draft"], "status": "completed", "open_item": ids["run"]},
            ]
        },
        served_by_door=True,
    ),
    ResultCase(
        "one result at its own path",
        lambda ids: {"status": "completed", "detail": "12 rows", "open_item": ids["run"]},
        path="/items/{call}/result",
        served_by_door=True,
    ),
    ResultCase("no token", _held, token=None, served_by_door=True),
    ResultCase("no results", lambda ids: {"results": []}, served_by_door=True),
    ResultCase("an unknown status", _one("exploded"), served_by_door=True),
    ResultCase("not an item id", lambda ids: {"status": "completed"}, path="/items/abc/result", served_by_door=True),
    ResultCase("a result without its run (the task may settle)", _one(), served_by_door=True),
    ResultCase(
        "the run's own end",
        lambda ids: {"results": [{"item": ids["run"], "status": "completed"}]},
        served_by_door=True,
    ),
    ResultCase("a stopped report", _one("stopped")),
    ResultCase(
        "a result and a stopped report together",
        lambda ids: {
            "results": [
                {"item": ids["call"], "status": "completed", "open_item": ids["run"]},
                {"item": ids["draft"], "status": "stopped", "open_item": ids["run"]},
            ]
        },
    ),
    ResultCase("the same result again", _held, setup=_finished),
    ResultCase("a result after Stop, the call still running", _held, setup=_stop_pressed, served_by_door=True),
    ResultCase("a late result, the call cancelled", _held, setup=_cancelled),
    ResultCase("no such item", lambda ids: {"results": [{"item": 999_999, "status": "completed"}]}),
    ResultCase("another runtime's item", lambda ids: {"results": [{"item": ids["theirs"], "status": "completed"}]}),
]


def _send_results(
    case: ResultCase, where: str, api: Api, door: str, token: str, theirs: int
) -> tuple[int, Any, int, dict[int, str]]:
    task = task_create(title=f"{case.name} at {where}", actor="test", runtime=api.runtime)
    ids = {"task": task.pk, "theirs": theirs}
    for name, noun in (("run", "agent run"), ("call", "lookup call"), ("draft", "draft")):
        ids[name] = item_register_started(task_id=task.pk, actor="test", kind="local_worker", noun=noun)
    if case.setup is not None:
        case.setup(ids)
    path = case.path.format(**ids)
    headers = {"content-type": "application/json"}
    if case.token is not None:
        headers["Authorization"] = f"Bearer {token}"
    raw = json.dumps(case.body(ids)).encode()
    names = {ids[name]: f"<{name}>" for name in ("run", "call", "draft")}
    if where == "web":
        answer = api.call("POST", path, raw=raw, token=None, headers=headers)
        return answer.status, answer.body, task.pk, names
    response = httpx.post(door + path, content=raw, headers=headers, timeout=30)
    return response.status_code, response.json(), task.pk, names


def _task_items(task_id: int) -> tuple[bool, list[tuple[str, str, str, list[str]]]]:
    """Whether the task settled, and each item's state, outcome and events."""
    settled = Task.objects.get(pk=task_id).settled_at is not None
    items = [
        (item.noun, item.state, item.outcome, sorted(Event.objects.filter(item=item).values_list("kind", flat=True)))
        for item in WorkItem.objects.filter(task_id=task_id).order_by("pk")
    ]
    return settled, items


def test_every_result_gets_the_same_answer_and_writes_the_same_rows_at_both_doors(door, web_api, django_requests):
    other, _ = runtime_create(name="someone-else", actor="test")
    theirs_task = task_create(title="theirs", actor="test", runtime=other).pk
    theirs = item_register_started(task_id=theirs_task, actor="test", kind="local_worker", noun="lookup call")
    for case in RESULT_CASES:
        answers = {}
        for where in ("web", "door"):
            before = ledger_counts()
            seen = django_requests.count
            status, body, task_id, names = _send_results(case, where, web_api, door, web_api.token, theirs)
            written = {name: n - before[name] for name, n in ledger_counts().items()}
            answers[where] = (status, _alike(body, task_id, names), written, _task_items(task_id))
            if where == "door":
                served_here = django_requests.count == seen
                assert served_here == case.served_by_door, (case.name, status, body)
        assert answers["door"] == answers["web"], case.name


def test_a_registration_at_the_door_is_a_running_item_with_its_events(door, runtime_token):
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    answer = httpx.post(
        f"{door}/tasks/{task.pk}/items/started",
        json={**CALL, "kind": "external_operation", "submit_key": "send-1", "lease_seconds": 90, "worker": "w-1"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 201
    item = WorkItem.objects.get(pk=answer.json()["id"])
    assert answer.json() == {"id": item.pk, "task": task.pk}
    assert (item.state, item.noun, item.handle, item.label) == (S.RUNNING, "lookup call", "call_1", "lookup")
    assert item.submitted_at is not None and item.idempotency_key == "send-1" and item.worker == "w-1"
    assert (item.lease_until - item.started_at).total_seconds() == pytest.approx(90, abs=1)
    assert set(Event.objects.filter(item=item).values_list("actor", flat=True)) == {f"runtime:{runtime.name}"}


def test_a_repeated_key_is_answered_with_the_first_answer_and_another_body_is_refused(door, runtime_token):
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k-1"}
    url = f"{door}/tasks/{task.pk}/items/started"
    first = httpx.post(url, json=CALL, headers=headers)
    again = httpx.post(url, json=CALL, headers=headers)
    other = httpx.post(url, json={**CALL, "handle": "call_2"}, headers=headers)
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    assert other.status_code == 422 and other.json()["field"] == "Idempotency-Key"
    assert WorkItem.objects.filter(task=task).count() == 1
    [stored] = ApiIdempotency.objects.filter(key="k-1")
    assert (stored.status, stored.body, stored.endpoint) == (200, first.json(), f"register_started:{task.pk}")


def test_twins_sent_at_once_to_both_doors_register_one_item(door, live_server, runtime_token):
    """The same request with one key, sent by eight threads at once, half to each door: one item,
    one answer (the rest of them replayed, their work rolled back)."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "twin"}
    urls = [f"{base}/tasks/{task.pk}/items/started" for base in (door, live_server.url + "/api/v1")] * 4
    answers: list[tuple[int, Any]] = []
    start = threading.Barrier(len(urls))

    def send(url: str) -> None:
        start.wait(timeout=10)
        response = httpx.post(url, json=CALL, headers=headers, timeout=30)
        answers.append((response.status_code, response.json()))

    threads = [threading.Thread(target=send, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    connection.close()
    [item] = WorkItem.objects.filter(task=task)
    assert answers == [(201, {"id": item.pk, "task": task.pk})] * len(urls)
    assert ApiIdempotency.objects.filter(key="twin").count() == 1


def test_registrations_racing_a_stop_at_the_door_never_start_after_it(door, runtime_token):
    """Threads register through the door while Stop commits: every item that started did so
    before the stop request; every one after it is recorded, cancelled, and answered 409."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    url = f"{door}/tasks/{task.pk}/items/started"
    answers: list[int] = []
    go = threading.Event()

    def register(n: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            go.wait(timeout=10)
            for i in range(15):
                answers.append(http.post(url, json={**CALL, "handle": f"call_{n}_{i}"}).status_code)

    threads = [threading.Thread(target=register, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    go.set()
    while len(answers) < 10:
        threading.Event().wait(0.005)
    task_request_stop(task_id=task.pk, actor="user:operator", **NO_DISPATCH)
    for thread in threads:
        thread.join(timeout=60)
    connection.close()
    stopped_at = Task.objects.get(pk=task.pk).stop_requested_at
    items = list(WorkItem.objects.filter(task=task))
    assert len(items) == len(answers) == 60
    started = [i for i in items if i.state == S.RUNNING]
    refused = [i for i in items if i.state == S.CANCELLED]
    assert len(started) + len(refused) == 60 and started and refused
    assert all(i.started_at < stopped_at for i in started)
    assert sorted(answers) == [201] * len(started) + [409] * len(refused)


# --- the tokens the door remembers ----------------------------------------------------------------


def _at_door(door: str, path: str, token: str, body: Any = None, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    return httpx.post(door + path, content=content, headers=headers, timeout=30)


REMEMBERED_REQUESTS = {
    "a registration": lambda task, item: (f"/tasks/{task}/items/started", {**CALL, "handle": "call_3"}, None),
    "results": lambda task, item: ("/results", {"results": [{"item": item, "status": "completed"}]}, None),
    "one result": lambda task, item: (f"/items/{item}/result", {"status": "completed"}, None),
    "a body that is not JSON": lambda task, item: (f"/tasks/{task}/items/started", None, b"{nope"),
    "a path that is not an id": lambda task, item: ("/items/abc/result", {"status": "completed"}, None),
}


@pytest.mark.parametrize("request_name", REMEMBERED_REQUESTS)
@pytest.mark.parametrize("change", ["revoked", "rotated"])
def test_a_token_the_door_remembers_is_refused_there_once_revoked_or_rotated(
    door, runtime_token, django_requests, change, request_name
):
    """The door reads a token once, then checks it inside the statements it writes with: once the
    token is revoked or replaced, every request with it is refused (401, the web door's answer),
    before anything else is said of the request, and nothing is written."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    assert _at_door(door, f"/tasks/{task.pk}/items/started", token, CALL).status_code == 201  # the token read
    seen = django_requests.count
    running = _at_door(door, f"/tasks/{task.pk}/items/started", token, {**CALL, "handle": "call_2"})
    assert running.status_code == 201 and django_requests.count == seen  # remembered: the door's own
    if change == "revoked":
        runtime_revoke(runtime=runtime, actor="test")
    else:
        runtime_rotate(runtime=runtime, actor="test")
    before = ledger_counts()
    path, body, raw = REMEMBERED_REQUESTS[request_name](task.pk, running.json()["id"])
    answer = _at_door(door, path, token, body, raw)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"] == "unauthorized" and answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert ledger_counts() == before
    assert WorkItem.objects.get(pk=running.json()["id"]).state == S.RUNNING


def test_a_rotated_token_is_read_afresh_and_served_at_the_door(door, runtime_token, django_requests):
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    assert _at_door(door, f"/tasks/{task.pk}/items/started", token, CALL).status_code == 201
    new_token = runtime_rotate(runtime=runtime, actor="test")
    seen = django_requests.count
    answers = [
        _at_door(door, f"/tasks/{task.pk}/items/started", new_token, {**CALL, "handle": f"call_{n}"}).status_code
        for n in range(2)
    ]
    assert answers == [201, 201] and django_requests.count == seen
    assert _at_door(door, f"/tasks/{task.pk}/items/started", token, CALL).status_code == 401


def test_a_renamed_runtime_writes_under_its_new_name_at_the_door(door, runtime_token):
    """The runtime's name is the events' actor: a door that remembered the old name writes nothing
    with it (Django answers that request) and learns the new one."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    first = _at_door(door, f"/tasks/{task.pk}/items/started", token, CALL).json()["id"]
    runtime.name = "renamed-agent"
    runtime.save()
    later = [
        _at_door(door, f"/tasks/{task.pk}/items/started", token, {**CALL, "handle": f"call_{n}"}).json()["id"]
        for n in range(2)
    ]
    actors = {item: set(Event.objects.filter(item_id=item).values_list("actor", flat=True)) for item in [first, *later]}
    assert actors == {first: {"runtime:watching-agent"}, **{item: {"runtime:renamed-agent"} for item in later}}


def test_registrations_racing_a_revoke_at_the_door_are_refused_once_it_has_committed(door, runtime_token):
    """Threads register through the door, their token remembered, while the token is revoked:
    every request sent after the revoke committed is refused, and every item written was
    answered 201."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    url = f"{door}/tasks/{task.pk}/items/started"
    sent: list[tuple[float, int]] = []  # (when it was sent, its status)
    go = threading.Event()
    revoked_at: list[float] = []

    def register(n: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            go.wait(timeout=10)
            for i in range(40):
                began = time.monotonic()
                status = http.post(url, json={**CALL, "handle": f"call_{n}_{i}"}).status_code
                sent.append((began, status))
                if revoked_at and began > revoked_at[0] + 0.05:
                    return

    threads = [threading.Thread(target=register, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    go.set()
    while len(sent) < 12:
        time.sleep(0.005)
    runtime_revoke(runtime=runtime, actor="test")
    revoked_at.append(time.monotonic())
    for thread in threads:
        thread.join(timeout=60)
    connection.close()
    after = [status for began, status in sent if began > revoked_at[0]]
    assert after and set(after) == {401}
    assert WorkItem.objects.filter(task=task).count() == sum(status == 201 for _, status in sent) >= 12


# --- the clients -------------------------------------------------------------------------------


def _root(door: str) -> str:
    return door.removesuffix("/api/v1")


def _unreachable() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_client_that_knows_the_watch_server_registers_at_the_door(door, live_server, runtime_token, django_requests):
    _, token = runtime_token
    with Client(live_server.url, token, watch_url=_root(door)) as sd:
        task = sd.create_task("Look Acme up")
        before = django_requests.count
        item_id = sd.register_started(task.id, kind="local_worker", noun="lookup call")
        assert django_requests.count == before  # the door's own, not a request of Django's
        assert sd.get_item(item_id).state == S.RUNNING


def test_the_async_client_learns_the_door_from_the_web_doors_answer_to_a_watch(
    door, live_server, runtime_token, django_requests, settings
):
    settings.STOPDESK_WATCH_URL = _root(door)  # the web door sends watches there (307)
    _, token = runtime_token

    async def main() -> tuple[list[int], list[int]]:
        async with AsyncClient(live_server.url, token) as sd:
            task = await sd.create_task("Look Acme up")
            before = django_requests.count
            first = await sd.register_started(task.id, kind="local_worker", noun="draft")
            at_web_door = django_requests.count - before
            watch = asyncio.ensure_future(sd.watch_stop(task.id, poll_s=1))
            while sd.watch_base == sd.base:
                await asyncio.sleep(0.01)
            watch.cancel()
            before = django_requests.count
            second = await sd.register_started(task.id, kind="local_worker", noun="lookup call")
            return [first, second], [at_web_door, django_requests.count - before]

    items, django_served = asyncio.run(main())
    assert django_served == [1, 0]  # the first at the web door; the second, once the door was known, at the door
    assert list(WorkItem.objects.filter(pk__in=items).values_list("state", flat=True)) == [S.RUNNING] * 2


class WhereServed:
    """Which requests Django served, by where they came in: handed on by the watch server (its
    threads), or at the web door."""

    def __init__(self) -> None:
        self.handed_on = self.web_door = 0
        self._lock = threading.Lock()

    def __call__(self, **_: Any) -> None:
        with self._lock:
            if threading.current_thread().name.startswith("stopdesk-agent-door"):
                self.handed_on += 1
            else:
                self.web_door += 1


def test_the_door_gets_the_results_it_writes_itself_and_the_web_door_the_rest(door, live_server, runtime_token):
    """A call's result and a run's own end go to the watch server, which writes them on its event
    loop (and then settles the task); a "stopped" report, which is Django's work, goes to the web
    door, so a Stop of hundreds of runs, each reporting its end, does not load the server carrying
    Stop to the watchers."""
    runtime, token = runtime_token
    task = task_create(title="Look Acme up", actor="test", runtime=runtime)
    run, done, stopped = (
        item_register_started(task_id=task.pk, actor="test", kind="local_worker", noun=noun)
        for noun in ("agent run", "lookup call", "export call")
    )
    where = WhereServed()
    request_started.connect(where, weak=False)
    try:
        with Client(live_server.url, token, watch_url=_root(door)) as sd:
            served = []
            for results in (
                [{"item": done, "status": "completed", "detail": "found", "open_item": run}],
                [{"item": stopped, "status": "stopped", "detail": "export: interrupted by Stop"}],
                [{"item": run, "status": "completed", "detail": ""}],
            ):
                before = (where.handed_on, where.web_door)
                sd.write_results(results)
                served.append((where.handed_on - before[0], where.web_door - before[1]))
    finally:
        request_started.disconnect(where)
    # The result at the door; the report at the web door; the run's end at the door.
    assert served == [(0, 0), (0, 1), (0, 0)]
    states = dict(WorkItem.objects.filter(task=task).values_list("pk", "state"))
    assert states == {done: S.COMPLETED, stopped: S.CANCELLED, run: S.COMPLETED}
    assert Task.objects.get(pk=task.pk).settled_at is not None  # checked by the door once the run's end committed


@pytest.mark.parametrize("client", ["sync", "async"])
def test_a_client_whose_watch_server_is_down_registers_at_the_web_door(live_server, runtime_token, client):
    _, token = runtime_token
    down = _unreachable()

    async def twice() -> list[int]:
        async with AsyncClient(live_server.url, token, watch_url=down) as sd:
            task = await sd.create_task("Look Acme up")
            return [await sd.register_started(task.id, kind="local_worker", noun="lookup call") for _ in range(2)]

    if client == "async":
        items = asyncio.run(twice())
    else:
        with Client(live_server.url, token, watch_url=down) as sd:
            task = sd.create_task("Look Acme up")
            items = [sd.register_started(task.id, kind="local_worker", noun="lookup call") for _ in range(2)]
    assert list(WorkItem.objects.filter(pk__in=items).values_list("state", flat=True)) == [S.RUNNING] * 2


def test_the_door_remembers_a_bounded_number_of_tokens_forgetting_the_first_read_first(monkeypatch):
    monkeypatch.setattr(agent_door, "TOKENS_REMEMBERED", 3)
    monkeypatch.setattr(agent_door, "_tokens", {})
    for n in range(5):
        agent_door._remember(f"hash-{n}", Runtime(name=f"agent-{n}"))
    assert list(agent_door._tokens) == ["hash-2", "hash-3", "hash-4"]
