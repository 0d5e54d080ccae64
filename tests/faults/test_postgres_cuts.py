"""PostgreSQL's connections cut under a Stop, through a TCP proxy of the test's own (as a database
restart cuts them): at the Stop's commit (before the server has it, and after it has it but
before the answer comes back), during the fan-out, and during a reconcile pass.

After each: the Stop either committed or its caller was told it failed; pressed again and with
the beat's jobs run (the fan-out resumer, the sweep), every item reaches a known state or
uncertain, none is lost, and nothing started after the boundary, though an agent kept trying."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from django.db import connection, connections

from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.services.reconcile import sweep_once
from stopdesk.models import StopRequest, Task, WorkItem
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_finish, item_register
from stopdesk.services.stop import stops_resume_fanout, task_request_stop
from stopdesk.services.transitions import item_start
from stopdesk.states import SETTLED, Kind
from stopdrill.sandbox.server import BackgroundServer
from tests.factories import make_task
from tests.faults.proxy import TcpProxy
from tests.reconcile.conftest import configure_openai

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUEUED = 10
RUNNING = 10
BOUND_S = 60.0

STOP_INSERT = rb'INSERT INTO "stopdesk_stoprequest"'
COMMIT = rb"COMMIT"
FANOUT_LOCK = rb'FROM "stopdesk_stoprequest" WHERE [^\x00]*FOR UPDATE'
SWEEP_ATTEMPT = rb'INSERT INTO "stopdesk_cancellationattempt"'


@pytest.fixture
def openai_url(settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    party = OpenAIStandin(queue_s=0.02, run_s=600.0)
    with BackgroundServer(party.app, name="openai") as server:
        configure_openai(settings, base_url=server.url + "/v1")
        yield server.url + "/v1"


@pytest.fixture
def pg_proxy(transactional_db) -> Iterator[TcpProxy]:  # type: ignore[no-untyped-def]
    """Every connection this process opens from here on (threads too) goes through the proxy."""
    db = connection.settings_dict  # one dict, shared by every thread's connection
    before = (db["HOST"], db["PORT"])
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    db["HOST"], db["PORT"] = "127.0.0.1", str(proxy.port)
    connections.close_all()
    yield proxy
    proxy.trigger = None
    connections.close_all()
    db["HOST"], db["PORT"] = before
    proxy.close()


@dataclass
class Agent:
    """Starts the task's queued items one by one, as an agent's loop does, and finishes each one
    it started (its work takes no time), until every item is started, refused or told to stop."""

    item_ids: list[int]
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    errors: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            while not self.done.is_set() and len(self.finished) + len(self.refused) < len(self.item_ids):
                self.step()
                time.sleep(0.05)
        finally:
            connection.close()

    def step(self) -> None:
        try:
            for item_id in self.started:
                if item_id not in self.finished:
                    item_finish(item_id=item_id, succeeded=True, actor="agent", outcome="done")
                    self.finished.append(item_id)
            waiting = [i for i in self.item_ids if i not in self.started and i not in self.refused]
            if waiting:
                try:
                    item_start(item_id=waiting[0], actor="agent")
                    self.started.append(waiting[0])
                except TaskStopped:
                    self.refused.append(waiting[0])
        except Exception:  # the cut connection; a new one next time
            self.errors += 1
            connection.close()


def prepare(url: str) -> tuple[Task, list[int]]:
    task = make_task()
    ids = [item_register(task=task, kind=Kind.LOCAL_WORKER, noun="step", actor="test").pk for _ in range(QUEUED)]
    for _ in range(RUNNING):
        item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
        response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft", timeout_s=10)
        ids.append(item.pk)
    return task, ids


def press_stop(task: Task) -> str:
    """What the person is told: "stopped", or the error that says it did not go through."""
    try:
        task_request_stop(task_id=task.pk, actor="user:operator", reason="fault drill", dispatch=lambda ids: None)
        return "stopped"
    except Exception as exc:
        return type(exc).__name__
    finally:
        connection.close()


def settle(ids: list[int], *, since: float) -> float:
    """The beat's jobs, at their pace, until every item has settled: the fan-out resumer (its
    30 s age limit aside) and the sweep (the broker lost every cancel job: the sweep does them)."""
    while time.monotonic() - since < BOUND_S:
        try:
            stops_resume_fanout(older_than_seconds=0, dispatch=lambda ids: None)
            sweep_once()
        except Exception:
            connection.close()
        if not WorkItem.objects.filter(pk__in=ids).exclude(state__in=SETTLED).exists():
            return time.monotonic() - since
        time.sleep(1.0)
    return time.monotonic() - since


def figures(name: str, task: Task, ids: list[int], agent: Agent, known_after: float) -> dict:  # type: ignore[type-arg]
    task.refresh_from_db()
    items = list(WorkItem.objects.filter(pk__in=ids))
    lost = [i.pk for i in items if i.state not in SETTLED]
    after = [
        i.pk
        for i in items
        if task.stop_requested_at is not None
        and any(at is not None and at >= task.stop_requested_at for at in (i.started_at, i.submitted_at))
    ]
    print(
        f"fault.pg_cut.{name} items={len(items)} time_to_known_s={known_after:.1f} lost={len(lost)} "
        f"after_boundary={len(after)} agent_started={len(agent.started)} agent_refused={len(agent.refused)} "
        f"agent_errors={agent.errors}"
    )
    return {"lost": lost, "after": after}


@pytest.mark.parametrize(
    ("name", "after", "on", "mode"),
    [
        ("stop_commit_never_arrives", STOP_INSERT, COMMIT, "drop"),
        ("stop_commit_answer_lost", STOP_INSERT, COMMIT, "unanswered"),
        ("fanout", None, FANOUT_LOCK, "drop"),
    ],
    ids=["stop_commit_never_arrives", "stop_commit_answer_lost", "fanout"],
)
def test_connections_cut_under_a_stop_lose_nothing(pg_proxy, openai_url, name, after, on, mode):
    task, ids = prepare(openai_url)
    agent = Agent(ids[:QUEUED])
    fired = pg_proxy.arm(on, mode=mode, after=after)
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        time.sleep(0.1)
        told = press_stop(task)
        cut_at = time.monotonic()
        assert fired.is_set(), "the cut happened where it was aimed"

        committed = StopRequest.objects.filter(task=task).exists()
        if name == "stop_commit_never_arrives":
            assert not committed and told != "stopped", "the commit never reached the server, and the person was told"
            assert not Task.objects.filter(pk=task.pk, stop_requested_at__isnull=False).exists(), "nothing half-written"
        elif name == "stop_commit_answer_lost":
            assert committed and told != "stopped", "committed, but its caller could not know: it says it failed"
        else:
            assert committed and told == "stopped", (
                "the stop committed, so the person is told it did; the resumer fans out"
            )
        # The person, told it failed, presses again: one stop either way.
        assert press_stop(task) == "stopped"
        assert StopRequest.objects.filter(task=task).count() == 1

        known_after = settle(ids, since=cut_at)
    finally:
        # The agent's thread ends with the test, passed or not (it holds a connection to the database).
        agent.done.set()
        runner.join(10)
    outcome = figures(name, task, ids, agent, known_after)
    assert outcome["lost"] == [] and outcome["after"] == []
    assert known_after <= BOUND_S


def test_connections_cut_during_a_reconcile_pass_lose_nothing(pg_proxy, openai_url):
    task, ids = prepare(openai_url)
    agent = Agent(ids[:QUEUED])
    assert press_stop(task) == "stopped"
    agent.run()  # every start is refused at the boundary, as it will be after the cut
    fired = pg_proxy.arm(SWEEP_ATTEMPT, mode="drop")
    cut_at = time.monotonic()
    try:
        sweep_once()
    except Exception:
        connection.close()
    assert fired.is_set(), "the pass lost its connections mid-way"

    known_after = settle(ids, since=cut_at)
    outcome = figures("reconcile_pass", task, ids, agent, known_after)
    assert outcome["lost"] == [] and outcome["after"] == []
    assert known_after <= BOUND_S
