"""Stop and the boundary on PostgreSQL.

stop.boundary_ms       committing the stop request, 10,000 queued + 1,000 running items (and 100,000)
stop.queued_cancel_ms  cancelling the queued items with their events (the fan-out transaction)
stop.statements        SQL statements in that fan-out, at both sizes: must not grow
stop.raw_cancel_ms     the ceiling: one hand-written statement cancelling the same queued items with
                       their events on the same database (same triggers, same indexes), same run;
                       stop.queued_cancel_ratio is the median fan-out over the median ceiling (<= 1.3)
boundary.starts_per_s  item starts per second from 4 concurrent workers, one round trip each
boundary.raw_starts_per_s  the ceiling: the same starts as one hand-written prepared statement
                       from bare psycopg connections; boundary.starts_ratio must be >= 0.75
boundary.raw_locked_starts_per_s  the same raw statement also taking the task row FOR NO KEY UPDATE
                       until commit, as the boundary did before its gate: what a row lock against
                       Stop would cost (boundary.starts_ratio_locked)
audit.seal_per_s       the audit chain's sealer working off what the figures above wrote (events
                       sealed per second after commit; the cost the hot path no longer pays)
celery_revoke.leaked / stopdesk.leaked   task bodies that ran after a stop, worker restarted in between
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import Figure

ROOT = Path(__file__).resolve().parents[1]
STARTS_PER_WORKER = 2500
WORKERS = 4
CELERY_TASKS = 1000


def _seed(queued: int, running: int):  # type: ignore[no-untyped-def]
    """Bulk-load a task. Seeding writes rows directly: it is set-up, not a state change."""
    from django.utils import timezone

    from stopdesk.models import Task, WorkItem
    from stopdesk.states import ItemState, Kind

    task = Task.objects.create(title=f"bench {queued}+{running}")
    now = timezone.now()
    rows = [WorkItem(task=task, kind=Kind.MODEL_REQUEST, noun="draft") for _ in range(queued)]
    rows += [
        WorkItem(
            task=task,
            kind=Kind.LOCAL_WORKER,
            noun="export",
            state=ItemState.RUNNING,
            started_at=now,
            lease_until=now + timezone.timedelta(minutes=10),
        )
        for _ in range(running)
    ]
    WorkItem.objects.bulk_create(rows, batch_size=5000)
    return task


def _stop_figures(queued: int, running: int, suffix: str) -> list[Figure]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from stopdesk.services.stop import _commit_stop_request, stop_fanout

    task = _seed(queued, running)
    started = time.perf_counter()
    stop_request, created = _commit_stop_request(task_id=task.pk, actor="bench", by=None, reason="bench")
    boundary_ms = (time.perf_counter() - started) * 1000
    assert created
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        ids = stop_fanout(stop_request_id=stop_request.pk, actor="bench", dispatch=lambda ids: None)
        cancel_ms = (time.perf_counter() - started) * 1000
    assert len(ids) == running
    return [
        Figure(f"stop.boundary_ms{suffix}", boundary_ms, "ms", target=20),
        # Also judged against the raw statement measured in the same run (stop.queued_cancel_ratio).
        # The audit chain is sealed after commit (audit.seal_per_s below), not by the insert.
        Figure(f"stop.queued_cancel_ms{suffix}", cancel_ms, "ms", target=250 if not suffix else None),
        Figure(f"stop.statements{suffix}", len(queries), "statements"),
    ]


RAW_CANCEL_SQL = """
WITH moved AS (
    UPDATE stopdesk_workitem SET state = 'cancelled', finished_at = clock_timestamp(),
        updated_at = clock_timestamp(), outcome = 'stopped before it started'
    WHERE task_id = %s AND state = 'queued'
    RETURNING id, task_id, updated_at
)
INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
SELECT updated_at, task_id, id, 'transition', 'bench', 'queued', 'cancelled', '', '{}'::jsonb FROM moved
"""
CEILING_RUNS = 3


def _cancel_ceiling(queued: int, running: int) -> list[Figure]:
    """The fan-out and a raw one-statement cancel of the same shape, alternated on fresh tasks;
    medians of CEILING_RUNS each."""
    import statistics

    from django.db import connection

    from stopdesk.services.stop import _commit_stop_request, stop_fanout

    ours, raw = [], []
    for _ in range(CEILING_RUNS):
        task = _seed(queued, running)
        stop_request, _ = _commit_stop_request(task_id=task.pk, actor="bench", by=None, reason="bench")
        started = time.perf_counter()
        stop_fanout(stop_request_id=stop_request.pk, actor="bench", dispatch=lambda ids: None)
        ours.append((time.perf_counter() - started) * 1000)
        task = _seed(queued, running)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(RAW_CANCEL_SQL, [task.pk])
            assert cursor.rowcount == queued, cursor.rowcount
        raw.append((time.perf_counter() - started) * 1000)
    ours_ms, raw_ms = statistics.median(ours), statistics.median(raw)
    return [
        Figure("stop.queued_cancel_median_ms", ours_ms, "ms"),
        Figure("stop.raw_cancel_ms", raw_ms, "ms"),
        Figure("stop.queued_cancel_ratio", ours_ms / raw_ms, "x raw", target=1.3),
    ]


RAW_START_SQL = """
WITH u AS (
    UPDATE stopdesk_workitem w SET state = 'running', started_at = clock_timestamp(),
        heartbeat_at = clock_timestamp(), lease_until = clock_timestamp() + interval '5 minutes',
        updated_at = clock_timestamp()
    WHERE w.id = %s AND w.state = 'queued'
      AND NOT EXISTS (SELECT 1 FROM stopdesk_task t WHERE t.id = w.task_id AND t.stop_requested_at IS NOT NULL)
    RETURNING w.id, w.task_id, w.updated_at
)
INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
SELECT updated_at, task_id, id, 'transition', 'bench', 'queued', 'running', '', '{}'::jsonb FROM u
"""


# The same start, taking the task row FOR NO KEY UPDATE as the boundary did against Stop before its
# gate (the lock is held until commit, so a task's starts take turns through each commit's WAL
# flush). Kept for comparison: the gate lets a task's starts overlap.
RAW_LOCKED_START_SQL = """
WITH t AS (
    SELECT id FROM stopdesk_task
    WHERE id = (SELECT task_id FROM stopdesk_workitem WHERE id = %s) AND stop_requested_at IS NULL
    FOR NO KEY UPDATE
),
u AS (
    UPDATE stopdesk_workitem w SET state = 'running', started_at = clock_timestamp(),
        heartbeat_at = clock_timestamp(), lease_until = clock_timestamp() + interval '5 minutes',
        updated_at = clock_timestamp()
    FROM t WHERE w.id = %s AND w.task_id = t.id AND w.state = 'queued'
    RETURNING w.id, w.task_id, w.updated_at
)
INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
SELECT updated_at, task_id, id, 'transition', 'bench', 'queued', 'running', '', '{}'::jsonb FROM u
"""


def _raw_start_all(dsn: str, chunk: list[int], gate: Any, locked: bool) -> None:
    import psycopg

    sql, twice = (RAW_LOCKED_START_SQL, True) if locked else (RAW_START_SQL, False)
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        conn.execute(sql, [chunk[0]] * (1 + twice))
        gate.wait()
        for item_id in chunk[1:]:
            conn.execute(sql, [item_id] * (1 + twice))


def _raw_starts_per_second(*, locked: bool = False) -> float:
    import multiprocessing

    from django.db import connection, connections

    from stopdesk.models import WorkItem

    task = _seed(WORKERS * STARTS_PER_WORKER, 0)
    ids = list(WorkItem.objects.filter(task=task).values_list("id", flat=True))
    db = connection.settings_dict
    dsn = f"postgresql://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    connections.close_all()
    context = multiprocessing.get_context("fork")
    gate = context.Barrier(WORKERS + 1)
    workers = [
        context.Process(target=_raw_start_all, args=(dsn, ids[i::WORKERS], gate, locked)) for i in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    gate.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError("a raw start process failed")
    running = WorkItem.objects.filter(task=task, state="running").count()
    if running != len(ids):
        raise AssertionError(f"only {running} of {len(ids)} items are running")
    return (len(ids) - WORKERS) / elapsed


def _start_all(chunk: list[int], gate: Any) -> None:
    """One worker process: open its connection, wait for the others, start its items."""
    from django.db import connections

    from stopdesk.services.transitions import item_start

    item_start(item_id=chunk[0], actor="bench")  # connect before the clock starts
    gate.wait()
    for item_id in chunk[1:]:
        item_start(item_id=item_id, actor="bench")
    connections.close_all()


def _starts_per_second() -> list[Figure]:
    """Four worker processes, as a prefork Celery pool runs them (threads in one process would
    measure the GIL as much as the boundary)."""
    import multiprocessing

    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from stopdesk.models import WorkItem
    from stopdesk.services.transitions import item_start

    task = _seed(WORKERS * STARTS_PER_WORKER + 1, 0)
    ids = list(WorkItem.objects.filter(task=task).values_list("id", flat=True))
    probe = ids.pop()
    with CaptureQueriesContext(connection) as queries:
        item_start(item_id=probe, actor="bench")
    connections.close_all()  # a forked child must open its own connection, never share ours
    context = multiprocessing.get_context("fork")
    gate = context.Barrier(WORKERS + 1)
    workers = [context.Process(target=_start_all, args=(ids[i::WORKERS], gate)) for i in range(WORKERS)]
    for worker in workers:
        worker.start()
    gate.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError("a worker process failed")
    started_items = WorkItem.objects.filter(task=task, state="running").count()
    if started_items != len(ids) + 1:
        raise AssertionError(f"only {started_items} of {len(ids) + 1} items are running")
    rate = (len(ids) - WORKERS) / elapsed
    raw = _raw_starts_per_second()
    raw_locked = _raw_starts_per_second(locked=True)
    return [
        # All starts are in one task here; each holds the task's gate shared until it commits (the
        # boundary's lock against Stop). Also judged against the raw statement doing the same
        # (boundary.starts_ratio).
        Figure("boundary.starts_per_s", rate, "starts/s", target=2000, higher_is_better=True),
        Figure("boundary.raw_starts_per_s", raw, "starts/s"),
        Figure("boundary.starts_ratio", rate / raw, "x raw", target=0.75, higher_is_better=True),
        # What a row lock against Stop (the boundary's before the gate) costs by itself.
        Figure("boundary.raw_locked_starts_per_s", raw_locked, "starts/s"),
        Figure("boundary.starts_ratio_locked", rate / raw_locked, "x raw locked"),
        Figure("boundary.round_trips_per_start", len(queries), "statements", target=1),
    ]


def _seal_figures() -> list[Figure]:
    """The sealer working off everything the figures above wrote, as the beat job would."""
    from stopdesk.services.audit import audit_verify
    from stopdesk.services.audit_seal import audit_seal, audit_unsealed

    backlog = audit_unsealed().events
    started = time.perf_counter()
    sealed = audit_seal(wait=True) or 0
    elapsed = time.perf_counter() - started
    report = audit_verify(seal=False)
    if report.breaks or sealed < backlog:
        raise AssertionError(f"sealed {sealed} of {backlog}; broken: {report.breaks[:3] if report.breaks else []}")
    return [Figure("audit.seal_per_s", sealed / elapsed, f"events/s ({sealed} events)")]


class _Worker:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "stopdesk",
                "worker",
                "--pool=prefork",
                "-c",
                "2",
                "-n",
                "bench@local",
                "--without-mingle",
                "--without-gossip",
                "-I",
                "bench.celery_tasks",
                "-l",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)


def _leak_race() -> list[Figure]:
    """Same 1,000 queued tasks, both ways: a worker that is online but not consuming receives the
    stop (a revoke broadcast, or stopdesk's Stop), is restarted, and the new worker drains the queue.
    """
    import redis
    from django.db import transaction

    from bench import celery_tasks
    from stopdesk.agent.workers import dispatch
    from stopdesk.celery import app
    from stopdesk.models import Task
    from stopdesk.services.stop import task_request_stop

    broker = os.environ.get("STOPDESK_BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
    redis.Redis.from_url(broker).flushdb()
    app.conf.broker_url = broker
    folder = Path(tempfile.mkdtemp(prefix="stopdesk-bench-"))
    env = {**os.environ, "CELERY_BROKER_URL": broker, "PYTHONPATH": str(ROOT)}
    results = {}
    try:
        for mode in ("celery_revoke", "stopdesk"):
            worker = _Worker(env, folder / f"{mode}-1.log")
            app.control.cancel_consumer("celery", destination=["bench@local"], reply=True, timeout=5)
            if mode == "celery_revoke":
                ids = [celery_tasks.plain_mark.apply_async(args=[str(folder), n]).id for n in range(CELERY_TASKS)]
                replies = app.control.revoke(ids, reply=True, timeout=5)
                assert replies, "the worker did not acknowledge the revoke"
            else:
                task = Task.objects.create(title="bench leak")
                with transaction.atomic():
                    for _ in range(CELERY_TASKS):
                        dispatch(celery_tasks.ledger_mark, task=task, noun="draft", actor="bench", args=[str(folder)])
                task_request_stop(task_id=task.pk, actor="bench", dispatch=lambda ids: None)
            worker.stop()
            worker = _Worker(env, folder / f"{mode}-2.log")
            deadline = time.monotonic() + 120
            client = redis.Redis.from_url(broker)
            while client.llen("celery") and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2)
            worker.stop()
            prefix = "plain-" if mode == "celery_revoke" else "ledger-"
            results[mode] = len(list(folder.glob(f"{prefix}*")))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return [
        Figure("celery_revoke.leaked", results["celery_revoke"], f"of {CELERY_TASKS} bodies ran"),
        Figure("stopdesk.leaked", results["stopdesk"], f"of {CELERY_TASKS} bodies ran", target=0),
    ]


def run() -> list[Figure]:
    figures = _stop_figures(10_000, 1_000, "")
    figures += _cancel_ceiling(10_000, 1_000)
    figures += _stop_figures(100_000, 1_000, "@100k")
    figures += _starts_per_second()
    figures += _seal_figures()
    figures += _leak_race()
    return figures
