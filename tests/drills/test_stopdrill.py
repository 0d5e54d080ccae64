"""The drill runner: real drills on the sandbox hold, an unsafe mechanism is caught, results are
kept, and docs/RELIABILITY.md is written from a run."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from reconcile.models import DrillResult, DrillRun
from stopdrill.drills import reliability
from stopdrill.drills.runner import run_drills
from stopdrill.drills.table import table

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_every_drill_holds_for_http_operations(drill_sandbox):
    report = run_drills(mechanisms=["http"], sandbox=drill_sandbox)

    assert [o.verdict for o in report.outcomes] == ["pass"] * 7, table(report)
    totals = report.totals()
    assert totals["lost"] == 0 and totals["after_boundary"] == 0 and totals["audit_gaps"] == 0
    assert totals["external_actions"] >= 6


def test_an_openai_child_dispatched_after_stop_sends_nothing(drill_sandbox):
    # Regression for the first real run: response_create skipped the boundary for an item that
    # Stop's set-based update had already cancelled, and a create reached the stand-in.
    report = run_drills(mechanisms=["openai"], drills=["before_dispatch", "duplicate_stop"], sandbox=drill_sandbox)

    assert report.passed, table(report)
    assert report.outcomes[0].external_actions == 0


def test_celery_and_manual_children_are_accounted_for(drill_sandbox):
    report = run_drills(
        mechanisms=["celery", "manual"], drills=["during_tool_call", "disconnected_client"], sandbox=drill_sandbox
    )

    assert report.passed, table(report)
    celery_during = report.outcomes[0]
    assert celery_during.observed == "cancelled"
    assert any(i["parent"] for i in celery_during.items), "the job's steps are child items of their own"


def test_a_mechanism_that_submits_after_the_boundary_fails_its_drill(drill_sandbox, unsafe_mechanism):
    report = run_drills(mechanisms=[unsafe_mechanism], drills=["during_tool_call"], sandbox=drill_sandbox)

    outcome = report.outcomes[0]
    assert outcome.verdict == "FAIL"
    assert not report.passed
    assert outcome.after_boundary >= 1
    assert any("never passed the boundary" in v for v in outcome.violations)
    assert any("ledger records cancelled" in v for v in outcome.violations), "the CRM holds records the ledger denies"
    assert "FAIL" in table(report)


def test_stopdrill_exits_non_zero_on_a_failure_and_stores_the_run(unsafe_mechanism, capsys):
    with pytest.raises(CommandError) as failed:
        call_command("stopdrill", "--mechanism", unsafe_mechanism, "--drill", "during_tool_call")

    assert failed.value.returncode == 1
    printed = capsys.readouterr().out
    assert "during_tool_call" in printed and "FAIL" in printed
    run = DrillRun.objects.get()
    assert run.passed is False and run.finished_at is not None
    row = DrillResult.objects.get(run=run)
    assert (row.drill, row.mechanism, row.passed) == ("during_tool_call", "unsafe", False)
    assert row.items and row.task_id is not None


def test_stopdrill_passes_and_writes_the_reliability_document(tmp_path, capsys):
    path = tmp_path / "RELIABILITY.md"

    call_command("stopdrill", "--mechanism", "http", "--drill", "before_dispatch", "--write-reliability", str(path))

    text = path.read_text()
    assert "Items lost: **0**" in text
    assert "Actions after the boundary: **0**" in text
    assert "stopdrill" in text and "| before_dispatch | http |" in text
    # The command as it would be typed, with no path of this machine in it.
    assert (
        "python manage.py stopdrill --drill before_dispatch --mechanism http --write-reliability RELIABILITY.md`"
        in text
    )
    assert str(tmp_path) not in text
    assert DrillRun.objects.get().passed is True
    assert "pass" in capsys.readouterr().out


def test_the_reliability_document_says_so_when_work_was_lost(drill_sandbox, unsafe_mechanism):
    report = run_drills(mechanisms=[unsafe_mechanism], drills=["during_tool_call"], sandbox=drill_sandbox, store=False)

    text = reliability.render(report, command="python manage.py stopdrill")

    assert "Items lost: **0**" not in text
    assert "| FAIL |" in text


def test_the_inspection_reads_items_and_events_as_of_one_moment():
    """A worker settling items while the drill is inspected: each inspection sees every item in
    the state its events lead to. Read one after the other, an item settled between the reads
    looked like an audit gap ("running but its events end at completed"), and a full run failed
    on it."""
    from stopdesk.models import Task
    from stopdesk.services.items import item_finish, item_register_started, task_create
    from stopdesk.states import Kind
    from stopdrill.drills.checks import inspect_drill
    from stopdrill.drills.core import DrillContext

    ctx = DrillContext(sandbox=None, mechanism="manual", drill="settling while inspected")
    ctx.task = task_create(title="inspected while it works", actor="test")
    task_id = ctx.task.pk
    done, errors = threading.Event(), []

    def work() -> None:
        try:
            for n in range(80):
                item_id = item_register_started(task_id=task_id, actor="test", kind=Kind.REMOTE_TOOL, noun=f"call {n}")
                item_finish(item_id=item_id, succeeded=True, actor="test")
        except Exception as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            done.set()
            connections.close_all()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    inspections, gaps = 0, []
    while not done.is_set():
        gaps += inspect_drill(ctx).audit
        inspections += 1
    worker.join(30)
    assert errors == []
    assert inspections >= 5, "the worker finished before the inspections could overlap it"
    assert gaps == []
    assert Task.objects.get(pk=task_id).items.filter(state="completed").count() == 80
