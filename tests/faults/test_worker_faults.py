"""Faults with real processes around a Celery job: SIGKILL mid-item, Redis restarted during the
stop, PostgreSQL connections dropped during the stop, a child slower than every timeout.

After each: nothing after the boundary (ledger and CRM), every item settled or uncertain with a
deadline, the audit complete; `stopdrill.drills.checks` does the inspecting."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from stopdesk.agent.workers import dispatch
from stopdesk.models import WorkItem
from stopdesk.services.stop import stops_resume_fanout
from stopdrill.drills.agent import drill_steps
from stopdrill.drills.checks import inspect_drill
from tests.faults.conftest import fault_context
from tests.workers.conftest import wait_for

pytestmark = [
    pytest.mark.faults,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def start_job(ctx, *, steps: int = 60, step_s: float = 0.15, slow_s: float = 0.0) -> WorkItem:  # type: ignore[no-untyped-def]
    crm = ctx.sandbox.urls["crm"]
    item = dispatch(
        drill_steps,
        task=ctx.task,
        noun="job",
        actor="test:agent",
        args=[crm, steps, step_s, slow_s, ctx.sandbox.system("crm")],
    )
    wait_for(lambda: WorkItem.objects.filter(pk=item.pk, state="running").exists(), timeout=20)
    if not slow_s:
        wait_for(lambda: ctx.sandbox.sandbox.crm.records(), timeout=20)
    return item


def assert_accounted(ctx) -> None:  # type: ignore[no-untyped-def]
    assert ctx.settle(bound_s=10), "items did not settle"
    inspection = inspect_drill(ctx)
    assert inspection.violations == [], inspection.violations
    assert not inspection.after_boundary and not inspection.lost and not inspection.audit
    for report in inspection.items:
        assert report.state in ("completed", "failed", "cancelled", "uncertain"), report
        if report.state == "uncertain":
            assert report.investigate_by


def test_a_worker_killed_with_sigkill_mid_item_leaves_it_uncertain(
    drill_sandbox, short_deadlines, own_redis, worker_on
):
    ctx = fault_context(drill_sandbox, "celery", "sigkill")
    worker = worker_on(own_redis.url)
    job = start_job(ctx)

    worker.kill()
    ctx.fault("worker: SIGKILL mid-item")
    ctx.stop()

    assert_accounted(ctx)
    job.refresh_from_db()
    assert job.state == "uncertain", "nobody is left to report it; only a person can say what it did"
    records_before = len(drill_sandbox.sandbox.crm.records())
    assert records_before == WorkItem.objects.filter(parent=job, state="completed").count()


def test_redis_restarted_during_a_stop_loses_no_cancel(drill_sandbox, short_deadlines, own_redis, worker_on):
    ctx = fault_context(drill_sandbox, "celery", "redis restart")
    worker_on(own_redis.url)
    job = start_job(ctx)

    own_redis.stop()  # the broker goes away with the job running ...
    ctx.stop()  # ... the stop commits and its revoke broadcast fails ...
    own_redis.start()  # ... and the broker comes back, empty.

    assert_accounted(ctx)
    job.refresh_from_db()
    # The boundary is in PostgreSQL: the job read it between steps, whatever happened to Redis.
    assert job.state == "cancelled"
    revokes = [a for a in job.attempts.all() if a.action == "cancel"]
    # The job may have read the stop before the cancel job ran (then there was nothing to revoke);
    # a revoke that was sent found no broker, and said so instead of hanging the stop.
    assert all("revoke_error" in (a.detail or {}) for a in revokes)


def test_postgres_connections_dropped_during_a_stop(drill_sandbox, short_deadlines, own_redis, worker_on):
    ctx = fault_context(drill_sandbox, "celery", "postgres connections dropped")
    worker_on(own_redis.url)
    job = start_job(ctx)

    def drop_others() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])

    failures: list[str] = []

    def press_stop() -> None:
        try:
            ctx.stop()
        except Exception as exc:  # the connection went away under the stop: it did not commit
            failures.append(type(exc).__name__)
        finally:
            connection.close()

    dropped = drop_others()
    stopper = threading.Thread(target=press_stop)
    stopper.start()
    dropped += drop_others()  # again while the stop is under way
    stopper.join(30)
    if not ctx.stop_outcomes:
        # The stop's own connection was dropped before it committed; the operator sees an error
        # and presses again, and nothing half-done is left from the first press.
        assert failures
        ctx.stop()

    assert dropped >= 1, "the worker's connections were dropped"
    if any(outcome.fanout_pending for outcome in ctx.stop_outcomes):
        # The stop committed and its fan-out lost its connection: the beat's resumer finishes it
        # once the stop is 30 s old; run now, as it would then (the job may also have read the
        # stop itself meanwhile, and then this finds nothing left to do).
        stops_resume_fanout(older_than_seconds=0, dispatch=ctx._cancel)
    assert_accounted(ctx)
    job.refresh_from_db()
    # Either the job read the stop and recorded cancelled, or the dropped connection failed it
    # (and it said so, on a fresh connection), or nobody could say: uncertain. Never running.
    assert job.state in ("cancelled", "failed", "uncertain")
    if job.state == "failed":
        assert "connection" in job.outcome.lower()


def test_a_child_slower_than_every_timeout_is_uncertain_and_submits_nothing_after_the_stop(
    drill_sandbox, short_deadlines, own_redis, worker_on
):
    ctx = fault_context(drill_sandbox, "celery", "slow child")
    worker_on(own_redis.url)
    job = start_job(ctx, steps=2, slow_s=4.0)

    ctx.stop()
    assert_accounted(ctx)
    job.refresh_from_db()
    assert job.state == "uncertain"

    # The job wakes up after its deadline and tries its next action: refused at the boundary.
    wait_for(lambda: WorkItem.objects.filter(parent=job).exists(), timeout=10)
    assert_accounted(ctx)
    assert drill_sandbox.sandbox.crm.records() == []
    assert WorkItem.objects.get(parent=job).state == "cancelled"
