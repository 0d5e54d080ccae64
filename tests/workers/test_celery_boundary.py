"""Agent code as Celery tasks, against real worker processes on Redis and the PostgreSQL ledger."""

from pathlib import Path

import pytest

from stopdesk.agent.workers import dispatch
from stopdesk.models import Event, WorkItem
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState as S
from tests.factories import make_task
from tests.workers import agent_tasks
from tests.workers.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _state(item_id: int) -> str:
    return WorkItem.objects.get(pk=item_id).state


def test_a_message_delivered_after_stop_does_not_run_its_body(start_worker, tmp_path: Path):
    task = make_task()
    items = [dispatch(agent_tasks.mark, task=task, noun="draft", actor="agent", args=[str(tmp_path)]) for _ in range(5)]
    # The messages are on the broker; no worker has seen them yet. Stop, then start a worker.
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    worker = start_worker()
    wait_for(lambda: "tests.mark" in worker.log.read_text() and worker.log.read_text().count("succeeded") >= 5)
    assert not list(tmp_path.glob("ran-*")), "a task body ran after the stop"
    assert {_state(i.pk) for i in items} == {S.CANCELLED}


def test_a_message_delivered_before_stop_runs_and_is_recorded(start_worker, tmp_path: Path):
    start_worker()
    task = make_task()
    item = dispatch(agent_tasks.mark, task=task, noun="draft", actor="agent", args=[str(tmp_path)])
    wait_for(lambda: _state(item.pk) == S.COMPLETED)
    assert (tmp_path / f"ran-{item.pk}").exists()
    assert Event.objects.filter(item=item, to_state=S.RUNNING, actor="celery:tests.mark").exists()


def test_a_cooperative_task_stops_between_steps(start_worker, tmp_path: Path):
    start_worker()
    task = make_task()
    item = dispatch(agent_tasks.steps, task=task, noun="report", actor="agent", args=[str(tmp_path), 100])
    wait_for(lambda: len(list(tmp_path.glob(f"step-{item.pk}-*"))) >= 3)
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    wait_for(lambda: _state(item.pk) == S.CANCELLED)
    steps_run = len(list(tmp_path.glob(f"step-{item.pk}-*")))
    assert steps_run < 100
    assert WorkItem.objects.get(pk=item.pk).outcome == "stopped between steps"


def test_a_worker_killed_mid_item_is_found_by_its_restart(start_worker, tmp_path: Path):
    worker = start_worker("w1@test", lease_seconds=60)
    task = make_task()
    item = dispatch(agent_tasks.slow, task=task, noun="export", actor="agent", args=[str(tmp_path), 30])
    wait_for(lambda: (tmp_path / f"started-{item.pk}").exists())
    assert _state(item.pk) == S.RUNNING
    worker.kill()
    # Nothing in any process's memory survives; a restarted worker reads the ledger.
    assert _state(item.pk) == S.RUNNING
    start_worker("w1@test", lease_seconds=60)
    wait_for(lambda: _state(item.pk) == S.AWAITING_RECONCILIATION)
    assert not (tmp_path / f"finished-{item.pk}").exists()
    assert Event.objects.filter(item=item, kind="lease_expired", to_state=S.AWAITING_RECONCILIATION).exists()


def test_a_lost_worker_is_found_by_another_worker_once_its_lease_runs_out(start_worker, tmp_path: Path):
    worker = start_worker("w1@test", lease_seconds=2)
    task = make_task()
    item = dispatch(agent_tasks.slow, task=task, noun="export", actor="agent", args=[str(tmp_path), 30])
    wait_for(lambda: (tmp_path / f"started-{item.pk}").exists())
    worker.kill()
    wait_for(
        lambda: WorkItem.objects.get(pk=item.pk).lease_until < __import__("django.utils.timezone").utils.timezone.now(),
        timeout=10,
    )
    start_worker("w2@test", lease_seconds=2)
    wait_for(lambda: _state(item.pk) == S.AWAITING_RECONCILIATION)


def test_two_runs_at_once_in_a_threads_pool_keep_their_own_stop(start_worker, tmp_path: Path):
    # `manage.py up` runs its worker with the threads pool: one task object, two bodies at once.
    start_worker(pool="threads")
    tasks = [make_task("first"), make_task("second")]
    items = [
        dispatch(agent_tasks.steps_with_cleanup, task=t, noun="report", actor="agent", args=[str(tmp_path), 40])
        for t in tasks
    ]
    wait_for(lambda: all(len(list(tmp_path.glob(f"step-{i.pk}-*"))) >= 3 for i in items))
    # Stop the run that started last: sharing state on the task object, the other run would read
    # the heartbeat of this one and stop too.
    by_start = sorted(items, key=lambda i: WorkItem.objects.get(pk=i.pk).started_at)
    stopped, other = by_start[1], by_start[0]
    task_request_stop(task_id=stopped.task_id, actor="user:operator", dispatch=lambda ids: None)
    wait_for(lambda: (tmp_path / f"cleanup-{stopped.pk}").exists())
    wait_for(lambda: _state(stopped.pk) == S.CANCELLED)
    assert not (tmp_path / f"cleanup-{other.pk}").exists()
    steps_then = len(list(tmp_path.glob(f"step-{other.pk}-*")))
    wait_for(lambda: len(list(tmp_path.glob(f"step-{other.pk}-*"))) >= steps_then + 5)
    assert _state(other.pk) == S.RUNNING
    wait_for(lambda: _state(other.pk) == S.COMPLETED)
    assert len(list(tmp_path.glob(f"step-{other.pk}-*"))) == 40
    assert WorkItem.objects.get(pk=stopped.pk).outcome == "stopped between steps"


def test_a_run_that_reads_stop_through_local_runtime_is_recorded_cancelled(start_worker, tmp_path: Path):
    # One StopRequested for every door: the in-process runtime's heartbeat raises the same class
    # LedgerTask catches, so the run is recorded cancelled, not failed.
    start_worker()
    task = make_task()
    item = dispatch(agent_tasks.runtime_steps, task=task, noun="report", actor="agent", args=[str(tmp_path), 100])
    wait_for(lambda: len(list(tmp_path.glob(f"rstep-{item.pk}-*"))) >= 3)
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    wait_for(lambda: _state(item.pk) in (S.CANCELLED, S.FAILED))
    assert _state(item.pk) == S.CANCELLED
