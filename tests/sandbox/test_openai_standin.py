"""The Responses API stand-in, driven through the official openai SDK over real HTTP."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdrill.sandbox.server import BackgroundServer

Standin = tuple[OpenAIStandin, BackgroundServer]


def sdk(server: BackgroundServer, *, max_retries: int = 0, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-sandbox", max_retries=max_retries, timeout=timeout)


def start(client: openai.OpenAI, **extra: object) -> openai.types.responses.Response:
    return client.responses.create(model="gpt-sandbox", input="Summarise the ticket", background=True, **extra)


def wait_for(client: openai.OpenAI, response_id: str, status: str, within_s: float = 3.0) -> str:
    deadline = time.monotonic() + within_s
    seen = ""
    while time.monotonic() < deadline:
        seen = client.responses.retrieve(response_id).status or ""
        if seen == status:
            return seen
        time.sleep(0.05)
    return seen


def test_background_response_goes_queued_in_progress_completed_with_output(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server)

    created = start(client, metadata={"stopdesk_item": "42"}, store=True)

    assert created.status == "queued"
    assert created.background is True
    assert created.metadata == {"stopdesk_item": "42"}
    assert created.id.startswith("resp_")
    time.sleep(0.05)
    assert client.responses.retrieve(created.id).status == "in_progress"
    assert wait_for(client, created.id, "completed") == "completed"
    final = client.responses.retrieve(created.id)
    assert final.output_text.startswith("Stand-in answer to: Summarise the ticket")
    assert party.counts.count("create") == 1


def test_cancel_of_a_running_response_is_cancelled_and_repeating_it_is_idempotent(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server)
    created = start(client)

    first = client.responses.cancel(created.id)
    second = client.responses.cancel(created.id)

    assert first.status == "cancelled"
    assert second.status == "cancelled"
    assert second.output == []
    time.sleep(0.5)  # past the run time: a cancelled response stays cancelled by default
    assert client.responses.retrieve(created.id).status == "cancelled"
    assert party.counts.count("cancel", created.id) == 2


def test_cancel_after_completion_is_409_by_default_and_the_sdk_retries_it(openai_standin: Standin) -> None:
    party, server = openai_standin
    created = start(sdk(server))
    party.finish(created.id)

    with pytest.raises(openai.ConflictError):
        sdk(server, max_retries=2).responses.cancel(created.id)

    # The SDK retries 409: the stand-in reports every attempt it received.
    assert party.counts.count("cancel", created.id) == 3


def test_cancel_after_completion_can_answer_the_unchanged_object_like_sglang(openai_standin: Standin) -> None:
    party, server = openai_standin
    party.configure(cancel_on_terminal="200")
    client = sdk(server)
    created = start(client)
    party.finish(created.id, "failed")

    answer = client.responses.cancel(created.id)

    assert answer.status == "failed"
    assert answer.error is not None and answer.error.code == "server_error"


def test_cancel_of_a_foreground_response_is_400_and_unknown_ids_are_404(openai_standin: Standin) -> None:
    _party, server = openai_standin
    client = sdk(server)
    foreground = client.responses.create(model="gpt-sandbox", input="hi")
    assert foreground.status == "completed"

    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_does_not_exist")
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_does_not_exist")


def test_ignore_cancel_answers_in_progress_and_the_run_completes_anyway(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server)
    party.arm("ignore_cancel")
    created = start(client)
    time.sleep(0.05)

    answer = client.responses.cancel(created.id)

    assert answer.status == "in_progress"
    assert wait_for(client, created.id, "completed") == "completed"


def test_flip_to_completed_reads_cancelled_then_completed_with_output(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server)
    created = start(client)
    party.set_fault("flip_to_completed", target=created.id)

    assert client.responses.cancel(created.id).status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    time.sleep(0.35)
    late = client.responses.retrieve(created.id)

    assert late.status == "completed"
    assert late.output_text


@pytest.mark.parametrize(
    ("fault", "call", "error"),
    [
        ("cancel_409", "cancel", openai.ConflictError),
        ("cancel_500", "cancel", openai.InternalServerError),
        ("retrieve_500", "retrieve", openai.InternalServerError),
    ],
)
def test_error_faults_surface_as_sdk_errors_and_change_nothing(
    openai_standin: Standin, fault: str, call: str, error: type[Exception]
) -> None:
    party, server = openai_standin
    client = sdk(server)
    created = start(client)
    party.set_fault(fault, target=created.id)

    with pytest.raises(error):
        getattr(client.responses, call)(created.id)

    party.clear_faults()
    assert client.responses.retrieve(created.id).status in {"queued", "in_progress"}


def test_hang_never_answers_retrieve_or_cancel_and_does_not_block_shutdown(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server, timeout=0.3)
    created = start(client)
    party.set_fault("hang")

    with pytest.raises(openai.APITimeoutError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.APITimeoutError):
        client.responses.cancel(created.id)

    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 3.0
    assert party.get(created.id) is not None  # hang parks before the cancel is applied
    assert party.get(created.id)["status"] != "cancelled"  # type: ignore[index]


def test_a_timed_out_create_reached_the_server_three_times_and_left_orphans(openai_standin: Standin) -> None:
    party, server = openai_standin
    party.set_fault("create_hang")

    with pytest.raises(openai.APITimeoutError):
        start(sdk(server, max_retries=2, timeout=0.2))

    assert party.counts.count("create") == 3
    # No list endpoint upstream: only the side channel sees the three orphans.
    assert len(party.responses()) == 3
    assert httpx.get(server.url + "/v1/responses").status_code == 405


@pytest.mark.parametrize(("fault", "status"), [("fail", "failed"), ("incomplete", "incomplete")])
def test_fail_and_incomplete_faults_end_the_run_accordingly(openai_standin: Standin, fault: str, status: str) -> None:
    party, server = openai_standin
    client = sdk(server)
    party.arm(fault)
    created = start(client)
    other = start(client)

    assert wait_for(client, created.id, status) == status
    final = client.responses.retrieve(created.id)
    if status == "failed":
        assert final.error is not None and final.error.code == "server_error"
    else:
        assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
    assert wait_for(client, other.id, "completed") == "completed"  # armed for one response only


def test_latency_is_applied_to_every_request(openai_standin: Standin) -> None:
    party, server = openai_standin
    party.configure(latency_s=0.15)
    client = sdk(server)

    began = time.monotonic()
    created = start(client)
    client.responses.retrieve(created.id)

    assert time.monotonic() - began >= 0.3


def test_http_control_endpoints_steer_the_standin_from_another_process(openai_standin: Standin) -> None:
    party, server = openai_standin
    client = sdk(server)
    created = start(client)
    control = httpx.Client(base_url=server.url + "/_control")

    assert control.post("/faults", json={"fault": "cancel_500", "target": created.id}).status_code == 200
    assert control.post("/faults", json={"fault": "no_such_fault"}).status_code == 400
    assert control.post("/config", json={"run_s": 5.0}).json()["run_s"] == 5.0
    with pytest.raises(openai.InternalServerError):
        client.responses.cancel(created.id)
    finished = control.post(f"/responses/{created.id}/finish", json={"status": "completed"}).json()
    stats = control.get("/stats").json()
    listed = control.get("/responses").json()["data"]

    assert finished["status"] == "completed"
    assert client.responses.retrieve(created.id).status == "completed"
    assert stats["endpoints"]["create"] == 1
    assert stats["by_key"][created.id]["cancel"] == 1
    assert [r["id"] for r in listed] == [created.id]
    assert control.post("/reset").status_code == 200
    assert party.responses() == []


# --- webhooks --------------------------------------------------------------------------------

HOOK_SECRET = "whsec_" + base64.b64encode(b"stand-in-webhook-test-secret-32b").decode()


class Receiver:
    """A webhook endpoint on loopback that keeps what it was sent and fails the first `failing`
    deliveries with 500, as an endpoint that is down for a moment does."""

    def __init__(self, failing: int = 0) -> None:
        self.failing = failing
        self.got: list[tuple[bytes, dict[str, str]]] = []

    def app(self) -> Starlette:
        async def take(request: Request) -> Response:
            self.got.append((await request.body(), dict(request.headers)))
            return Response(status_code=500 if len(self.got) <= self.failing else 200)

        return Starlette(routes=[Route("/hooks/openai", take, methods=["POST"])])


@contextlib.contextmanager
def hooks_to(party: OpenAIStandin, receiver: Receiver) -> Iterator[BackgroundServer]:
    with BackgroundServer(receiver.app, name="receiver") as server:
        party.configure(webhook_url=server.url + "/hooks/openai", webhook_secret=HOOK_SECRET)
        yield server


def arrived(receiver: Receiver, count: int, within_s: float = 5.0) -> list[tuple[bytes, dict[str, str]]]:
    deadline = time.monotonic() + within_s
    while len(receiver.got) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return list(receiver.got)


def verified(body: bytes, headers: dict[str, str]) -> Any:
    """What the official SDK makes of a delivery (raises if the signature does not verify)."""
    return openai.OpenAI(api_key="unused", webhook_secret=HOOK_SECRET).webhooks.unwrap(body, headers)


def test_a_background_response_that_ends_sends_a_webhook_the_sdk_verifies(openai_standin: Standin) -> None:
    party, server = openai_standin
    receiver = Receiver()
    with hooks_to(party, receiver):
        created = start(sdk(server))
        ((body, headers),) = arrived(receiver, 1)
        event = verified(body, headers)
        assert (event.type, event.data.id) == ("response.completed", created.id)
        assert json.loads(body)["object"] == "event" and headers["webhook-id"].startswith("wh_")
        # Nobody read it: the run ended on the stand-in's clock and the webhook said so.
        assert party.counts.count("retrieve") == 0
        sdk(server).responses.create(model="gpt-sandbox", input="foreground", background=False)
        time.sleep(0.3)
        assert len(receiver.got) == 1  # a foreground response sends none


def test_a_delivery_without_a_2xx_is_tried_again_with_its_id_and_a_fresh_signature(openai_standin: Standin) -> None:
    party, server = openai_standin
    receiver = Receiver(failing=2)
    with hooks_to(party, receiver):
        created = start(sdk(server))
        got = arrived(receiver, 3, within_s=8.0)
        assert len(got) == 3
        assert {headers["webhook-id"] for _, headers in got} == {got[0][1]["webhook-id"]}
        assert all(verified(body, headers).data.id == created.id for body, headers in got)
        sent = [s for s in party.webhooks_sent() if s["response_id"] == created.id]
        assert [(s["attempt"], s["status"]) for s in sent] == [(1, 500), (2, 500), (3, 200)]


def test_a_cancel_that_flips_sends_both_events(openai_standin: Standin) -> None:
    party, server = openai_standin
    receiver = Receiver()
    with hooks_to(party, receiver):
        party.run_s = 30.0
        party.arm("flip_to_completed")
        created = start(sdk(server))
        sdk(server).responses.cancel(created.id)
        got = arrived(receiver, 2)
        assert sorted(verified(body, headers).type for body, headers in got) == [
            "response.cancelled",
            "response.completed",
        ]


def test_an_unstored_background_response_is_not_found_once_its_retention_is_over(openai_standin: Standin) -> None:
    party, server = openai_standin
    party.configure(unstored_retention_s=0.3)
    client = sdk(server)
    kept, unstored = start(client, store=True), start(client, store=False)
    assert wait_for(client, unstored.id, "completed") == "completed"  # readable while it is kept
    time.sleep(0.5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    assert client.responses.retrieve(kept.id).status == "completed"
