"""Stop's own record is complete whatever the order: an item in flight when Stop committed carries
`cancel_requested_at` (and one `cancel_requested` event), whether Stop's fan-out or the agent's own
settle got there first, through every door an agent settles by. An item settled before the stop
carries neither.

Four steps interleave: the stop's commit (C), the push reaching the agent (P), the agent's settle
of its item (S) and the stop's fan-out (F). C comes before P and F (the push and the fan-out follow
the commit); S goes anywhere, including into a race for the item's row with F, either one queued
first behind a lock the test holds (PostgreSQL grants a row to its waiters in the order they came).
Real threads and connections against PostgreSQL; the HTTP door is a live server; the framework
door is the integrations' own `StopdeskRun` hearing Stop by push; the Celery door is `LedgerTask`
running a task body. (The asyncio supervisor is not a door here: it settles its children itself
the moment the push reaches it, so its settle cannot be placed apart from the push.)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connections, transaction

from reconcile.mechanisms import registry
from stopdesk.agent.frameworks.core import RunStopped, StopdeskRun
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.agent.workers import LedgerTask
from stopdesk.celery import app as celery_app
from stopdesk.client import Client
from stopdesk.models import Event, StopRequest, WorkItem
from stopdesk.protocol.errors import StopRequested
from stopdesk.services.items import item_register, task_create
from stopdesk.services.runtimes import runtime_create
from stopdesk.services.stop import _commit_stop_request, stop_fanout
from stopdesk.states import SETTLED
from stopdesk.states import ItemState as S
from tests.pg_waits import lock_waiters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

# Each order as its steps; "S<F" and "F<S" are S and F racing for the item's row, queued in that order.
ORDERS = [
    "S C P F",
    "S C F P",
    "C S P F",
    "C S F P",
    "C P S F",
    "C P F S",
    "C F S P",
    "C F P S",
    "C P S<F",
    "C P F<S",
]
SETTLES = {"stopped": S.CANCELLED, "finished": S.COMPLETED}
WITHIN_S = 15.0


@dataclass
class Door:
    """How an agent talks to stopdesk: its item in flight, its push, and its settle."""

    task_id: int
    item_id: int
    heard: Callable[[], bool]  # waits for the push; whether it came
    settle: Callable[[str], None]  # "stopped" (it heard Stop) or "finished" (it finished anyway)


def _in_process() -> Door:
    runtime = LocalRuntime(actor="agent:in-process", dispatch=lambda ids: None)
    task_id = runtime.create_task("race").id
    item_id = runtime.register_started(task_id, kind="local_worker", noun="step", mechanism="manual")
    watch = runtime.watch_stop(task_id)

    def settle(how: str) -> None:
        if how == "stopped":
            runtime.report_stopped(item_id, detail="heard the push")
        else:
            runtime.finish_fast(item_id, status="completed", detail="finished anyway")

    return Door(task_id, item_id, lambda: watch.wait(WITHIN_S), settle)


def _http(url: str) -> Door:
    client = Client(url, runtime_create(name="race-agent", actor="test")[1])
    task_id = client.create_task("race").id
    item_id = client.register_started(task_id, kind="local_worker", noun="step", mechanism="manual")
    watch = client.watch_stop(task_id)

    def settle(how: str) -> None:
        if how == "stopped":
            client.report_stopped(item_id, detail="heard the push")
        else:
            client.finish_fast(item_id, status="completed", detail="finished anyway")

    return Door(task_id, item_id, lambda: watch.wait(WITHIN_S), settle)


def _framework() -> Door:
    """A framework run's own item, settled by `StopdeskRun` on its way out; it hears Stop by push
    (its own watcher) as the integrations do. The run lives on its own thread and loop, and leaves
    when the test tells it how it ended."""
    runtime = LocalRuntime(actor="agent:framework", dispatch=lambda ids: None)
    task_id = runtime.create_task("race").id
    began, heard, ended = threading.Event(), threading.Event(), threading.Event()
    ending: queue.Queue[str] = queue.Queue()
    opened: list[int] = []

    async def agent() -> None:
        run = StopdeskRun(runtime, task_id, framework="langgraph", poll_s=3600)
        with contextlib.suppress(RunStopped):
            async with run:
                assert run.item_id is not None
                opened.append(run.item_id)
                run.on_stop(heard.set)
                began.set()
                if await asyncio.to_thread(ending.get) == "stopped":
                    raise RunStopped("stopped")

    errors: list[BaseException] = []
    life = _thread(lambda: asyncio.run(agent()), errors, done=ended)
    assert began.wait(WITHIN_S) and opened, errors

    def settle(how: str) -> None:
        ending.put(how)
        assert ended.wait(WITHIN_S), "the run never ended"
        life.join(WITHIN_S)
        assert not errors, errors

    # A run that has already ended has no watcher left for the push to reach.
    return Door(task_id, opened[0], lambda: ended.is_set() or heard.wait(WITHIN_S), settle)


@dataclass
class _Control:
    began: threading.Event = field(default_factory=threading.Event)
    heard: threading.Event = field(default_factory=threading.Event)
    ending: queue.Queue[str] = field(default_factory=queue.Queue)


CELERY_RUNS: dict[int, _Control] = {}


@celery_app.task(base=LedgerTask, bind=True, name="tests.stop_order_step")
def _celery_step(self: LedgerTask, *, item_id: int) -> str:
    """A Celery worker's body: it has passed the boundary (LedgerTask did), hears Stop through the
    flag LedgerTask's push sets, and ends as the test tells it."""
    control = CELERY_RUNS[item_id]
    flag = self._beat()
    assert flag is not None
    threading.Thread(target=lambda: flag.stopped.wait(WITHIN_S) and control.heard.set(), daemon=True).start()
    control.began.set()
    if control.ending.get(timeout=WITHIN_S) == "stopped":
        raise StopRequested("stopped between steps", item=item_id)
    return "done"


def _celery() -> Door:
    """A Celery task's item, run by the real LedgerTask (`apply`: the worker's code path, in a
    thread of this process), settled by LedgerTask when the body ends."""
    task = task_create(title="race", actor="test")
    item = item_register(task=task, actor="test", kind="local_worker", noun="step", mechanism="celery")
    control = CELERY_RUNS[item.pk] = _Control()
    errors: list[BaseException] = []
    ended = threading.Event()
    worker = _thread(lambda: _celery_step.apply(kwargs={"item_id": item.pk}).get(), errors, done=ended)
    assert control.began.wait(WITHIN_S), errors

    def settle(how: str) -> None:
        control.ending.put(how)
        assert ended.wait(WITHIN_S), "the task body never ended"
        worker.join(WITHIN_S)
        assert not errors, errors

    return Door(task.pk, item.pk, lambda: ended.is_set() or control.heard.wait(WITHIN_S), settle)


@pytest.fixture(params=["in-process", "http", "framework", "celery"])
def door(request: pytest.FixtureRequest, transactional_db: Any) -> Iterator[Door]:
    registry.reset()
    if request.param == "http":
        yield _http(request.getfixturevalue("live_server").url)
    elif request.param == "framework":
        yield _framework()
    elif request.param == "celery":
        yield _celery()
    else:
        yield _in_process()


def _thread(
    work: Callable[[], None], errors: list[BaseException], done: threading.Event | None = None
) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            connections.close_all()
            if done is not None:
                done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _waiters_reach(count: int, errors: list[BaseException]) -> None:
    deadline = time.monotonic() + WITHIN_S
    while lock_waiters() < count:
        assert not errors, errors
        assert time.monotonic() < deadline, f"never {count} session(s) waiting for the item's row"
        time.sleep(0.005)


class Steps:
    def __init__(self, door: Door, how: str) -> None:
        self.door, self.how = door, how
        self.stop_request_id: int | None = None

    def commit(self) -> None:
        stop, created = _commit_stop_request(task_id=self.door.task_id, actor="user:operator", by=None, reason="")
        assert created
        self.stop_request_id = stop.pk

    def push(self) -> None:
        assert self.door.heard(), "the push never reached the agent"

    def settle(self) -> None:
        self.door.settle(self.how)

    def fanout(self) -> None:
        assert self.stop_request_id is not None
        stop_fanout(stop_request_id=self.stop_request_id, actor="user:operator", dispatch=lambda ids: None)

    def race(self, first: Callable[[], None], second: Callable[[], None]) -> None:
        """`first` and `second` both wait for the item's row, which the test holds, queued in that
        order; then the test lets go and they go at it."""
        errors: list[BaseException] = []
        with transaction.atomic():
            list(WorkItem.objects.select_for_update().filter(pk=self.door.item_id).values_list("pk"))
            base = lock_waiters()
            one = _thread(first, errors)
            _waiters_reach(base + 1, errors)
            two = _thread(second, errors)
            _waiters_reach(base + 2, errors)
        for thread in (one, two):
            thread.join(WITHIN_S)
            assert not thread.is_alive(), "a step never finished"
        assert not errors, errors

    def run(self, order: str) -> None:
        """The steps in `order`; after each one, the record read as anyone would read it then."""
        single = {"C": self.commit, "P": self.push, "S": self.settle, "F": self.fanout}
        for step in order.split():
            if step == "S<F":
                self.race(self.settle, self.fanout)
            elif step == "F<S":
                self.race(self.fanout, self.settle)
            else:
                single[step]()
            assert_stop_record_complete(self.door.item_id, settled_before_stop=order.startswith("S"))


def assert_stop_record_complete(item_id: int, *, settled_before_stop: bool) -> None:
    """The property, true at every moment, not only once the fan-out has run: an item that Stop
    met in flight carries its stamp and exactly one event of it as soon as it settles (or as soon
    as the fan-out reaches it in flight); one that had settled before the stop carries neither."""
    item = WorkItem.objects.get(pk=item_id)
    stop = StopRequest.objects.filter(task=item.task_id).first()
    stamps = Event.objects.filter(item=item, kind="cancel_requested").count()
    if stop is None or settled_before_stop:
        assert (item.cancel_requested_at, stamps) == (None, 0)
        return
    fanned_out = stop.fanout_done_at is not None
    if item.state in SETTLED or fanned_out:
        assert item.cancel_requested_at is not None and item.cancel_requested_at >= stop.requested_at
        assert stamps == 1
        assert not item.needs_review
    else:
        assert (item.cancel_requested_at, stamps) == (None, 0)


@pytest.mark.parametrize("how", sorted(SETTLES))
@pytest.mark.parametrize("order", ORDERS)
def test_stops_record_is_complete_whatever_the_order(door, order, how):
    Steps(door, how).run(order)
    item = WorkItem.objects.get(pk=door.item_id)
    assert item.state == SETTLES[how]  # the agent's settle decides the state, whoever came first
    assert StopRequest.objects.get(task=door.task_id).fanout_done_at is not None
