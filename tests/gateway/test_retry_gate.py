"""A client gives up on a write (its stream closes, as a dropped connection's would) and calls it
again: the first call is cancelled upstream and recorded uncertain, and the gateway holds the
identical retry until the first is settled, naming it and its review link; once the first is
known to have taken effect the retry is refused, once known not to have it passes. A tool declared
idempotent passes, and so does a call repeated after an answer the client got."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from django.contrib.auth.models import Group
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconcile.mechanisms.mcp import sandbox as tools
from reconcile.services.review import item_resolve
from stopdesk.agent.aio import in_thread  # closes the thread's connection after the call
from stopdesk.gateway.server import HELD, TOOK_EFFECT
from stopdesk.models import WorkItem
from stopdesk.permissions import roles_ensure
from stopdesk.states import ItemState
from tests.factories import make_task
from tests.gateway.conftest import CHECK, answers_recorded
from tests.gateway.test_gateway_calls import MODES, one_call_went, started, through_gateway, went
from tests.reconcile.helpers import sweep_until_settled

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
WRITE = {"key": "k9", "value": "v9", "seconds": 1.5}  # long enough to be cancelled once started


@pytest.fixture
def reviewer(cast):  # type: ignore[no-untyped-def]
    roles_ensure()
    cast["reviewer"].groups.add(Group.objects.get(name="reviewers"))
    return cast["reviewer"]


def give_up_once_started(party: tools.MCPToolServer):  # type: ignore[no-untyped-def]
    """A client body: call the write, and cancel the call once the upstream has started it."""

    async def body(client: Client) -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, tools.SLOW_WRITE, WRITE)
                while not started(party, tools.SLOW_WRITE):
                    await anyio.sleep(0.02)
                scope.cancel()

    return body


def settled_by_the_gateway(timeout_s: float = 5.0) -> WorkItem:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = WorkItem.objects.get()
        if item.state != S.RUNNING:
            return item
        time.sleep(0.05)
    raise AssertionError("the gateway never recorded the client's cancel")


def call_twice(party: tools.MCPToolServer) -> Any:
    async def body(client: Client) -> Any:
        await give_up_once_started(party)(client)
        await in_thread(settled_by_the_gateway)
        return await client.call_tool(tools.SLOW_WRITE, WRITE)

    return body


@pytest.mark.parametrize("mode", MODES)
def test_a_write_the_client_cancelled_is_cancelled_upstream_and_recorded_uncertain(gateway, mode):
    through_gateway(gateway.url, give_up_once_started(gateway.party), mode=mode)
    item = settled_by_the_gateway()
    assert item.state == S.UNCERTAIN and item.investigate_by is not None
    assert item.evidence["cancelled_by"] == "the client"
    assert went(gateway) == one_call_went(mode)
    assert "the status check (read_value) will look" in item.evidence["uncertain_because"]
    (upstream_call,) = gateway.party.wire("tools/call")
    assert item.detail["gateway"]["upstream_request_id"] == upstream_call["id"]
    deadline = time.monotonic() + 5
    while "interrupted" not in [e["event"] for e in gateway.party.journal(tools.SLOW_WRITE)]:
        assert time.monotonic() < deadline, "the upstream never saw its call cancelled"
        time.sleep(0.05)
    assert gateway.party.effects(tools.SLOW_WRITE) == []


@pytest.mark.parametrize("mode", MODES)
def test_an_identical_retry_is_held_naming_the_earlier_call_and_its_review_link(gateway, mode):
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, call_twice(gateway.party), mode=mode)
    earlier = WorkItem.objects.get()  # the retry was not registered, and not forwarded
    assert raised.value.error.code == HELD
    assert f"identical call (item {earlier.pk}, uncertain)" in raised.value.error.message
    assert f"http://localhost:8000/items/{earlier.pk}/" in raised.value.error.message
    assert len(gateway.party.wire("tools/call")) == 1


def test_other_arguments_pass_the_gate(gateway):
    async def body(client: Client) -> Any:
        await give_up_once_started(gateway.party)(client)
        await in_thread(settled_by_the_gateway)
        return await client.call_tool(tools.SLOW_WRITE, {**WRITE, "value": "other"})

    result = through_gateway(gateway.url, body, mode="auto")
    assert not result.is_error
    assert len(gateway.party.wire("tools/call")) == 2


def test_a_reviewer_settling_the_earlier_call_releases_the_retry(gateway, reviewer):
    async def body(client: Client) -> Any:
        await give_up_once_started(gateway.party)(client)
        earlier = await in_thread(settled_by_the_gateway)
        await in_thread(
            item_resolve,
            item_id=earlier.pk,
            outcome=S.FAILED,
            note="not sent",
            evidence="no k9 in the store",
            by=reviewer,
        )
        return await client.call_tool(tools.SLOW_WRITE, WRITE)  # the identical call

    result = through_gateway(gateway.url, body, mode="auto")
    assert not result.is_error
    assert [i.state for i in WorkItem.objects.order_by("pk")] == [S.FAILED, S.COMPLETED]


def resolved_then_called_again(party: tools.MCPToolServer, reviewer: Any, outcome: str) -> Any:
    async def body(client: Client) -> Any:
        await give_up_once_started(party)(client)
        earlier = await in_thread(settled_by_the_gateway)
        await in_thread(
            item_resolve, item_id=earlier.pk, outcome=outcome, note="sent", evidence="k9 is in the store", by=reviewer
        )
        return await client.call_tool(tools.SLOW_WRITE, WRITE)  # the identical call

    return body


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_of_a_call_a_reviewer_resolved_as_done_is_refused_as_taken_effect(gateway, reviewer, mode):
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, resolved_then_called_again(gateway.party, reviewer, S.COMPLETED), mode=mode)
    earlier = WorkItem.objects.get()  # the retry was not registered, and not forwarded
    assert earlier.state == S.COMPLETED
    assert raised.value.error.code == TOOK_EFFECT
    assert raised.value.error.message == (
        f"not forwarded: an identical call (item {earlier.pk}) already took effect (sent); "
        f"see http://localhost:8000/items/{earlier.pk}/"
    )
    assert len(gateway.party.wire("tools/call")) == 1


def test_a_retry_of_a_call_its_status_check_showed_took_effect_is_refused(gateway, clock):
    """The upstream ignores the cancel and the write lands; the reconciler's status check settles
    the earlier call completed, and the identical retry is refused."""
    gateway.party.set_fault(tools.IGNORE_CANCEL, target=WRITE["key"])
    task = make_task()
    through_gateway(gateway.url, give_up_once_started(gateway.party), mode="auto", task_id=task.pk)
    earlier = settled_by_the_gateway()
    assert earlier.state == S.UNCERTAIN
    deadline = time.monotonic() + 5
    while not gateway.party.effects(tools.SLOW_WRITE):
        assert time.monotonic() < deadline, "the write never landed"
        time.sleep(0.05)
    sweep_until_settled(clock, earlier)
    earlier.refresh_from_db()
    assert earlier.state == S.COMPLETED and "read_value shows it took effect" in earlier.outcome
    with pytest.raises(MCPError) as raised:
        through_gateway(gateway.url, lambda c: c.call_tool(tools.SLOW_WRITE, WRITE), mode="auto", task_id=task.pk)
    assert raised.value.error.code == TOOK_EFFECT
    assert f"identical call (item {earlier.pk}) already took effect" in raised.value.error.message
    # The write went upstream once; the other call there is the status check's read.
    assert [m["tool"] for m in gateway.party.wire("tools/call")] == [tools.SLOW_WRITE, tools.READ_VALUE]
    assert WorkItem.objects.count() == 1


def test_a_write_repeated_after_its_answer_came_passes(gateway):
    """The client got the answer each time: repeating the call is the agent's intent, not a retry."""
    write = {**WRITE, "seconds": 0.05}

    async def body(client: Client) -> Any:
        return [await client.call_tool(tools.SLOW_WRITE, write) for _ in range(2)]

    results = through_gateway(gateway.url, body, mode="auto")
    assert [r.is_error for r in results] == [False, False]
    assert [i.state for i in WorkItem.objects.order_by("pk")] == [S.COMPLETED, S.COMPLETED]
    assert len(gateway.party.wire("tools/call")) == 2


@pytest.mark.parametrize(
    "upstream_config", [{"tools": {tools.SLOW_WRITE: {"status_check": CHECK, "idempotent": True}}}]
)
def test_a_tool_declared_idempotent_passes_the_gate(gateway):
    result = through_gateway(gateway.url, call_twice(gateway.party), mode="auto")
    assert not result.is_error
    answers_recorded()
    assert [i.state for i in WorkItem.objects.order_by("pk")] == [S.UNCERTAIN, S.COMPLETED]
    assert len(gateway.party.wire("tools/call")) == 2


@pytest.mark.parametrize("mode", MODES)
def test_an_identical_write_sent_while_the_first_is_in_flight_is_held_but_an_identical_read_passes(gateway, mode):
    """Two copies of one call at once: the second write could land beside the first, so it is
    held while the first runs; two identical reads (read-only by the upstream's annotations) are
    harmless and both go through."""
    outcomes: dict[str, Any] = {}

    async def body(client: Client) -> None:
        async def call(name: str, tool: str, arguments: dict[str, Any]) -> None:
            try:
                outcomes[name] = await client.call_tool(tool, arguments)
            except MCPError as exc:
                outcomes[name] = exc

        lookup = {"query": "same", "seconds": 0.5}
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "write", tools.SLOW_WRITE, {**WRITE, "seconds": 1.0})
            while not started(gateway.party, tools.SLOW_WRITE):
                await anyio.sleep(0.02)
            tg.start_soon(call, "write again", tools.SLOW_WRITE, {**WRITE, "seconds": 1.0})
            tg.start_soon(call, "read", tools.SLOW_LOOKUP, lookup)
            while not started(gateway.party, tools.SLOW_LOOKUP):
                await anyio.sleep(0.02)
            tg.start_soon(call, "read again", tools.SLOW_LOOKUP, lookup)

    through_gateway(gateway.url, body, mode=mode)
    first = WorkItem.objects.get(detail__gateway__tool=tools.SLOW_WRITE)
    assert not outcomes["write"].is_error and first.state == S.COMPLETED
    held = outcomes["write again"]
    assert isinstance(held, MCPError) and held.error.code == HELD
    assert f"identical call (item {first.pk}, running)" in held.error.message
    assert not outcomes["read"].is_error and not outcomes["read again"].is_error
    calls = [m["tool"] for m in gateway.party.wire("tools/call")]
    assert sorted(calls) == [tools.SLOW_LOOKUP, tools.SLOW_LOOKUP, tools.SLOW_WRITE]


def test_identical_writes_sent_at_once_pass_the_gate_one_at_a_time(gateway):
    """Eight copies of one write sent together (a client retrying in a loop): each copy checks the
    gate and registers under one lock, so exactly one is forwarded and seven are held naming it."""
    outcomes: list[Any] = []

    async def body(client: Client) -> None:
        async def call() -> None:
            try:
                outcomes.append(await client.call_tool(tools.SLOW_WRITE, {**WRITE, "seconds": 0.5}))
            except MCPError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(call)

    through_gateway(gateway.url, body, mode="auto")
    [forwarded] = WorkItem.objects.all()
    held = [o for o in outcomes if isinstance(o, MCPError)]
    assert len(outcomes) == 8 and len(held) == 7
    assert all(o.error.code == HELD and f"(item {forwarded.pk}, " in o.error.message for o in held)
    assert len(gateway.party.wire("tools/call")) == 1
