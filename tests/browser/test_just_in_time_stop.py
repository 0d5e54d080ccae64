"""Stopping a just-in-time agent at a person's pace, in real Chromium.

The agent registers each child just before it sends it (register, submit, attach the record,
finish), one about every 0.7 s, over the runtime API: between two children every item has
settled, so its task flips between running and settled about once a second. A person opens the
task, waits through a few refreshes, opens the confirmation, types a reason and presses Stop.
Whatever instant each of those lands in, the stop commits with the typed reason and the agent's
next child is refused."""

from __future__ import annotations

import re
import threading
import time

import pytest

from stopdesk.client import Client, StopRequested
from stopdesk.models import Event, StopRequest, Task, WorkItem
from stopdesk.services.runtimes import runtime_create
from stopdesk.states import ItemState as S
from tests.browser.polls import count_polls, wait_for_polls

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY_DELAY_MS = 120  # a person typing at ordinary speed
REFRESHES_MS = 3500  # longer than three of the page's one-second refreshes
SEND_S = 0.2  # the call to the vendor system, between submit and its record
BETWEEN_S = 0.5  # settled between two children: the agent decides on the next one


class JustInTimeAgent(threading.Thread):
    """The ordinary loop: register a child just before sending it, then report it, one by one."""

    def __init__(self, url: str, token: str, task_id: int) -> None:
        super().__init__(name="just-in-time-agent", daemon=True)
        self.url, self.token, self.task_id = url, token, task_id
        self.sent: list[int] = []
        self.refused: StopRequested | None = None
        self.failed: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with Client(self.url, self.token, worker="vendor-agent", timeout=5) as sd:
                n = 0
                while not self.halt.is_set():
                    n += 1
                    item = sd.register(self.task_id, kind="external_operation", noun="vendor", label=f"vendor {n}")
                    try:
                        sd.submit(item.id, idempotency_key=f"bank-details-{self.task_id}-{n}")
                    except StopRequested as exc:
                        self.refused = exc
                        return
                    time.sleep(SEND_S)
                    sd.attach_record(item.id, system="erp", record_id=f"vendor-{n}", effect="updated", version="1")
                    sd.finish(item.id, status="completed")
                    self.sent.append(item.id)
                    time.sleep(BETWEEN_S)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.failed = exc


@pytest.fixture
def agent(live_server, roles, eager):  # type: ignore[no-untyped-def]
    from stopdesk.celery import app

    app.loader.import_default_modules()  # the cancel jobs Stop dispatches run eagerly here
    token = runtime_create(name="vendor-agent", actor="test")[1]
    with Client(live_server.url, token, timeout=5) as sd:
        task_id = sd.create_task("Update vendor bank details").id
    agent = JustInTimeAgent(live_server.url, token, task_id)
    agent.start()
    yield agent
    agent.halt.set()
    agent.join(timeout=10)


@pytest.fixture
def page(operator_page):  # type: ignore[no-untyped-def]
    return operator_page


def test_a_person_stops_a_just_in_time_agent_and_its_next_child_is_refused(live_server, page, agent, shots):
    while len(agent.sent) < 2:  # the agent is under way: its task has settled and reopened
        assert agent.failed is None and agent.is_alive(), agent.failed
        time.sleep(0.1)
    page.goto(f"{live_server.url}/tasks/{agent.task_id}/")
    count_polls(page)
    page.wait_for_timeout(REFRESHES_MS)  # a person reads the page while it refreshes
    wait_for_polls(page, 3)  # three refreshes back (on a busy machine they answer later)
    page.get_by_role("link", name="Stop…").click()
    page.get_by_role("heading", name="Stop this task?").wait_for()
    page.get_by_label("Reason").press_sequentially("Wrong vendor list", delay=KEY_DELAY_MS)
    page.wait_for_timeout(1500)  # a person reads what they typed; the task flips meanwhile
    assert page.get_by_label("Reason").input_value() == "Wrong vendor list"
    page.screenshot(path=str(shots / "just-in-time-confirm.png"))
    page.get_by_role("button", name="Stop the task").click()
    page.locator("#stop-state", has_text=re.compile("Stopping|Stopped")).wait_for()
    page.screenshot(path=str(shots / "just-in-time-stopped.png"))

    agent.join(timeout=10)
    assert agent.failed is None, agent.failed
    assert not agent.is_alive() and agent.refused is not None, "the agent's next child should have been refused"
    stop = StopRequest.objects.get(task_id=agent.task_id)
    assert stop.reason == "Wrong vendor list" and stop.actor == "user:operator"
    # The task really flipped while the person worked: settled, then reopened by new work.
    assert Event.objects.filter(task_id=agent.task_id, kind="task_reopened").count() >= 2
    # The child registered after the stop is recorded, cancelled, never started; nothing started after.
    refused = WorkItem.objects.get(pk=agent.refused.extra["item"])
    assert refused.state == S.CANCELLED and refused.started_at is None
    assert not WorkItem.objects.filter(task_id=agent.task_id, started_at__gte=stop.requested_at).exists()
    assert Task.objects.get(pk=agent.task_id).closed_at is None
    # Focus went to the new state, not to <body>.
    assert page.evaluate("document.activeElement && document.activeElement.id") == "stop-state"
