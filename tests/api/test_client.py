"""The Python client against a live server on 127.0.0.1, and its in-process twin."""

from __future__ import annotations

import asyncio
import http.server
import inspect
import threading
from collections.abc import Iterator

import httpx
import pytest

from stopdesk.agent.runtime import LocalRuntime
from stopdesk.client import AsyncClient, Client, Conflict, NotFound, StopRequested, Unauthorized
from stopdesk.models import Event, Task, WorkItem
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NO_DISPATCH = {"dispatch": lambda ids: None}


@pytest.fixture
def token(transactional_db) -> str:  # type: ignore[no-untyped-def]
    return runtime_create(name="live-agent", actor="test")[1]


@pytest.fixture
def sd(live_server, token) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    with Client(live_server.url, token, worker="pytest", timeout=5) as client:
        yield client


def test_start_raises_stop_requested_after_a_stop_from_another_thread(sd, live_server, token):
    task = sd.create_task("Analyse invoices")
    first = sd.register(task.id, kind="local_worker", noun="draft")
    second = sd.register(task.id, kind="local_worker", noun="draft")
    assert sd.start(first.id).state == S.RUNNING

    def operator() -> None:
        with Client(live_server.url, token) as other:
            other.request_stop(task.id, reason="operator pressed Stop")

    thread = threading.Thread(target=operator)
    thread.start()
    thread.join(10)
    with pytest.raises(StopRequested) as refused:
        sd.start(second.id)
    assert refused.value.item_id == second.id and refused.value.status == 409
    assert WorkItem.objects.get(pk=second.id).state == S.CANCELLED
    with pytest.raises(StopRequested):
        sd.heartbeat(first.id)
    assert sd.cancel(first.id).state == S.CANCELLED
    # The first draft had started, the second never did.
    assert sd.get_task(task.id).summary == (
        "Stopped new work. One draft cancelled before it started. One draft stopped before it finished."
    )


def test_submit_raises_stop_requested_and_the_action_body_never_runs(sd):
    task = sd.create_task("Send reminders")
    item = sd.register(task.id, kind="external_operation", noun="email")
    sd.request_stop(task.id)
    ran = []
    with pytest.raises(StopRequested), sd.external_action(item.id, idempotency_key="mail-1"):
        ran.append(True)
    assert ran == [] and sd.get_item(item.id).state == S.CANCELLED


def test_the_external_action_attaches_the_record_and_completes(sd):
    task = sd.create_task("Create CRM records")
    item = sd.register(task.id, kind="external_operation", noun="record")
    with sd.external_action(item.id, idempotency_key="crm-1") as action:
        action.record(
            system="crm", record_id="C-1", version="v1", effect="created", reversible=True, reversal="archive"
        )
    done = sd.get_item(item.id)
    assert done.state == S.COMPLETED and done.idempotency_key == "crm-1" and action.item.state == S.COMPLETED
    assert sd.get_task(task.id).summary == "Every item so far has finished; the task is still open. One record created."
    sd.close_task(task.id)
    assert sd.get_task(task.id).summary == "Finished. One record created."


def test_an_unknown_outcome_marks_the_item_uncertain_and_reraises(sd):
    task = sd.create_task("Create CRM records")
    item = sd.register(task.id, kind="external_operation", noun="record")
    with pytest.raises(TimeoutError), sd.external_action(item.id, idempotency_key="crm-2"):
        raise TimeoutError("CRM did not answer")
    uncertain = sd.get_item(item.id)
    assert uncertain.state == S.UNCERTAIN and uncertain.investigate_by is not None
    assert "TimeoutError" in uncertain.outcome


def test_a_definite_refusal_fails_the_item(sd):
    task = sd.create_task("Create CRM records")
    item = sd.register(task.id, kind="external_operation", noun="record")
    with (
        pytest.raises(PermissionError),
        sd.external_action(item.id, idempotency_key="crm-3", failures=(PermissionError,)),
    ):
        raise PermissionError("403 from the CRM")
    assert sd.get_item(item.id).state == S.FAILED


def test_errors_are_typed(sd, live_server):
    with pytest.raises(NotFound):
        sd.get_task(999_999)
    task = sd.create_task("t")
    item = sd.register(task.id, kind="local_worker", noun="draft")
    with pytest.raises(Conflict) as conflict:
        sd.finish(item.id, status="completed")
    assert conflict.value.state == S.QUEUED
    with Client(live_server.url, "sd_wrong") as stranger, pytest.raises(Unauthorized):
        stranger.get_task(task.id)


def test_the_async_client_has_the_same_flow(live_server, token):
    async def agent() -> str:
        async with AsyncClient(live_server.url, token) as sd:
            task = await sd.create_task("Analyse invoices")
            item = await sd.register(task.id, kind="model_request", noun="draft")
            action_item = await sd.register(task.id, kind="external_operation", noun="record")
            async with sd.external_action(action_item.id, idempotency_key="crm-9") as action:
                await action.record(system="crm", record_id="C-9", effect="created")
            await sd.request_stop(task.id)
            with pytest.raises(StopRequested):
                await sd.start(item.id)
            return (await sd.get_task(task.id)).summary

    assert asyncio.run(agent()) == "Stopped new work. One draft discarded. One record created; it cannot be undone."


class _DropFirstAnswer(http.server.BaseHTTPRequestHandler):
    """A loopback proxy that forwards each request but loses the first answer, as a network would."""

    upstream = ""
    dropped = 0
    to_drop = 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        answer = httpx.request("POST", self.upstream + self.path, content=body, headers=headers)
        if type(self).dropped < type(self).to_drop:
            type(self).dropped += 1
            self.close_connection = True
            self.connection.shutdown(2)  # the work was done, the answer never arrives
            return
        self.send_response(answer.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def lossy_proxy(live_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    handler = type("Handler", (_DropFirstAnswer,), {"upstream": live_server.url, "dropped": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_lost_answer_is_retried_with_the_same_key_and_the_work_is_done_once(lossy_proxy, token):
    with Client(lossy_proxy, token, retries=2, backoff_seconds=0.01) as sd:
        task = sd.create_task("Analyse invoices")
    assert Task.objects.count() == 1 and Task.objects.get().pk == task.id


def test_a_lost_answer_without_a_key_is_not_retried(lossy_proxy, token):
    with Client(lossy_proxy, token, retries=2, backoff_seconds=0.01) as sd:
        sd.http.headers["Authorization"] = f"Bearer {token}"
        from stopdesk.client import calls

        unkeyed = calls.Call("POST", "/tasks", {"title": "t"}, calls.TaskInfo.from_json, safe=False)
        with pytest.raises(httpx.RemoteProtocolError):
            sd._run(unkeyed)
    assert Task.objects.count() == 1  # done once, and not repeated blindly


def test_a_server_that_is_not_there_is_retried_then_raises(token):
    with Client("http://127.0.0.1:9", token, retries=2, backoff_seconds=0.01) as sd, pytest.raises(httpx.ConnectError):
        sd.get_task(1)


def test_the_async_client_retries_a_lost_answer_with_the_same_key_and_the_work_is_done_once(lossy_proxy, token):
    # Its calls go through aiohttp (stopdesk/client/aio_calls.py): the same retry policy.
    async def create() -> int:
        async with AsyncClient(lossy_proxy, token, retries=2, backoff_seconds=0.01) as sd:
            return (await sd.create_task("Analyse invoices")).id

    task_id = asyncio.run(create())
    assert [t.pk for t in Task.objects.all()] == [task_id]


def test_the_async_client_does_not_repeat_blindly_a_lost_answer_without_a_key(lossy_proxy, token):
    from stopdesk.client import calls

    async def unkeyed() -> None:
        async with AsyncClient(lossy_proxy, token, retries=2, backoff_seconds=0.01) as sd:
            await sd._run(calls.Call("POST", "/tasks", {"title": "t"}, calls.TaskInfo.from_json, safe=False))

    with pytest.raises(httpx.TransportError):  # as with httpx: the caller's error types hold
        asyncio.run(unkeyed())
    assert Task.objects.count() == 1  # done once, and not repeated blindly


def test_the_async_client_raises_connect_error_for_a_server_that_is_not_there(token):
    async def look() -> None:
        async with AsyncClient("http://127.0.0.1:9", token, retries=2, backoff_seconds=0.01) as sd:
            await sd.get_task(1)

    with pytest.raises(httpx.ConnectError):
        asyncio.run(look())


def test_local_runtime_has_the_clients_method_names():
    def public(cls: type) -> set[str]:
        # Plumbing, not calls: the clients' closing, and the in-process runtime's thread hooks.
        return {n for n, v in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")} - {
            "close",
            "aclose",
            "thread_prepare",
            "thread_close",
        }

    # One runtime: LocalRuntime has the calls a framework run makes most too, and so do the clients.
    assert public(Client) == public(AsyncClient) == public(LocalRuntime)
    for name in public(Client):
        client_params = list(inspect.signature(getattr(Client, name)).parameters)
        local = inspect.signature(getattr(LocalRuntime, name)).parameters
        named = [p for p, v in local.items() if v.kind is not v.VAR_KEYWORD]
        if len(named) < len(local):  # `**register`: the client names what it passes through
            assert [p for p in client_params if p in named] == named, name
        else:
            assert client_params == [p for p in named if p in client_params], name


def test_local_runtime_obeys_the_same_boundary(token):
    sd = LocalRuntime(actor="agent:local", **NO_DISPATCH)
    task = sd.create_task("Analyse invoices")
    item = sd.register(task.id, kind="local_worker", noun="draft")
    sd.request_stop(task.id)
    with pytest.raises(StopRequested):
        sd.start(item.id)
    assert sd.get_item(item.id).state == S.CANCELLED
    assert Event.objects.filter(item_id=item.id, kind="stop_cancelled", to_state=S.CANCELLED).exists()


def test_the_client_retries_a_lost_answer_with_the_same_body_and_a_new_body_needs_a_new_key(lossy_proxy, token):
    from stopdesk.client import IdempotencyKeyReused

    with Client(lossy_proxy, token, retries=2, backoff_seconds=0.01) as sd:
        task = sd.create_task("Analyse invoices", request_key="create-1")  # first answer lost, retried
        assert sd.create_task("Analyse invoices", request_key="create-1").id == task.id
        with pytest.raises(IdempotencyKeyReused) as refused:
            sd.create_task("Payroll", request_key="create-1")
    assert refused.value.status == 422 and refused.value.field == "Idempotency-Key"
    assert list(Task.objects.values_list("title", flat=True)) == ["Analyse invoices"]
