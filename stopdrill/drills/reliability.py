"""docs/RELIABILITY.md, written from a real drill run (never by hand).

The process-level fault tests (tests/faults) are listed with how to run them; given a JUnit XML
file from a pytest run of them (`--fault-results`), each one's result from that run is shown too.
"""

from __future__ import annotations

import platform
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from django.db import connection
from django.utils import timezone

from stopdrill.drills.runner import Report
from stopdrill.drills.table import markdown_table

# tests/faults, by test function: what each one does to a real process or connection.
FAULT_TESTS: list[tuple[str, str, str]] = [
    ("test_worker_faults.py", "test_a_worker_killed_with_sigkill_mid_item_leaves_it_uncertain",
     "SIGKILL a Celery worker mid-item, then Stop: the job ends uncertain; its CRM records match its completed steps"),
    ("test_worker_faults.py", "test_redis_restarted_during_a_stop_loses_no_cancel",
     "Redis (the test's own server) stopped under a running job, Stop pressed, Redis restarted empty: the job reads "
     "the boundary from PostgreSQL and ends cancelled"),
    ("test_worker_faults.py", "test_postgres_connections_dropped_during_a_stop",
     "PostgreSQL connections terminated (pg_terminate_backend) before and during a Stop: cancelled, failed with a "
     "connection error, or uncertain; never left running"),
    ("test_api_faults.py", "test_a_client_that_hangs_up_mid_body_stops_nothing",
     "a client disconnects in the middle of its stop POST body: no stop is recorded"),
    ("test_api_faults.py", "test_a_client_that_hangs_up_before_the_answer_still_stops_exactly_once",
     "a client disconnects before reading the stop answer: one stop; pressing again is a duplicate, nothing re-sent"),
    ("test_api_faults.py", "test_the_cancellation_endpoint_down_for_the_whole_deadline_leaves_items_uncertain",
     "the cancellation endpoint down for the whole deadline (OpenAI cancel/retrieve hang; CRM lookups 500): "
     "uncertain"),
    ("test_api_faults.py", "test_two_stops_at_once_over_http_make_one_stop",
     "two stops at once over HTTP: one stop, one duplicate, one cancel for the running item"),
    ("test_worker_faults.py",
     "test_a_child_slower_than_every_timeout_is_uncertain_and_submits_nothing_after_the_stop",
     "a job step slower than every timeout: uncertain; its next action is refused at the boundary"),
    ("test_canceller_faults.py", "test_a_canceller_killed_mid_batch_frees_its_items_within_one_lease",
     "Stop's batched canceller SIGKILLed mid-batch (120 items, every call out): the sweep cancels them all within "
     "one lease of the kill, not after the claim's length"),
    ("test_launcher_faults.py", "test_the_launcher_killed_with_sigkill_leaves_no_child_running",
     "the `make run` launcher SIGKILLed with the demo running: its guard stops every child within seconds"),
    ("test_postgres_cuts.py", "test_connections_cut_under_a_stop_lose_nothing[stop_commit_never_arrives]",
     "PostgreSQL connections cut (a proxy) as the stop's COMMIT is sent: not committed, the caller is told, "
     "nothing half-written; pressed again, every item known, none started after the boundary"),
    ("test_postgres_cuts.py", "test_connections_cut_under_a_stop_lose_nothing[stop_commit_answer_lost]",
     "PostgreSQL connections cut once the stop's COMMIT is in but before its answer: committed, the caller is "
     "told it failed; pressed again, one stop, every item known"),
    ("test_postgres_cuts.py", "test_connections_cut_under_a_stop_lose_nothing[fanout]",
     "PostgreSQL connections cut during the stop's fan-out: the stop stands, the resumer finishes the fan-out"),
    ("test_postgres_cuts.py", "test_connections_cut_during_a_reconcile_pass_lose_nothing",
     "PostgreSQL connections cut during a reconcile pass: its items are due again within one lease"),
    ("test_broker_faults.py", "test_the_broker_lost_during_the_fanout_and_back_empty_the_sweep_cancels_every_item",
     "the broker stopped as Stop fans out 120 items and restarted empty: beat's sweep cancels every item"),
    ("test_watch_faults.py", "test_the_watch_server_killed_under_200_watchers_loses_no_stop",
     "the watch server SIGKILLed under 200 watchers, 100 stops pressed while it is down: every agent hears its Stop"),
]  # fmt: skip


@dataclass(frozen=True)
class FaultResult:
    name: str
    outcome: str  # "passed", "failed", "skipped", "error"
    seconds: float


def read_junit(path: Path) -> dict[str, FaultResult]:
    """Test function name -> its result, from a pytest `--junitxml` file."""
    results: dict[str, FaultResult] = {}
    # Our own pytest run's report, a local file the operator names: not untrusted input.
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
        name = case.get("name", "")
        results[name] = FaultResult(name, outcome, float(case.get("time") or 0))
    return results


def _faults_section(fault_results: Path | None) -> list[str]:
    lines = [
        "## Process-level fault tests (tests/faults)",
        "",
        "Real processes and connections, not drills: run with `make test-faults` (PostgreSQL and Redis on",
        "127.0.0.1; PostgreSQL's connections are cut through a TCP proxy of the test's own, and the broker",
        "restarted is a redis-server of the test's own), and by `make test` in CI (`.ci/run`).",
        "",
    ]
    results = read_junit(fault_results) if fault_results is not None else {}
    if results and fault_results is not None:
        lines += [f"Results below are from `{fault_results.name}`, a JUnit XML report of a pytest run.", ""]
        lines += ["| fault | test | result |", "|---|---|---|"]
    else:
        lines += ["Not run as part of this drill; results come from the test run.", ""]
        lines += ["| fault | test |", "|---|---|"]
    for module, name, what in FAULT_TESTS:
        test = f"`{module}::{name}`"
        if results:
            found = results.get(name)
            result = f"{found.outcome} ({found.seconds:.1f} s)" if found else "not in that run"
            lines.append(f"| {what} | {test} | {result} |")
        else:
            lines.append(f"| {what} | {test} |")
    lines.append("")
    return lines


def render(report: Report, *, command: str, fault_results: Path | None = None) -> str:
    totals = report.totals()
    run = report.run
    db = connection.settings_dict
    faults = sorted({f for o in report.ran for f in o.faults})
    lines = [
        "# Reliability: what the stop drills showed",
        "",
        "Written by `manage.py stopdrill --write-reliability` from the run below; do not edit by hand.",
        "",
        f"- Command: `{command}`",
        f"- When: {timezone.now():%Y-%m-%d %H:%M UTC}" + (f" (drill run #{run.pk})" if run else ""),
        f"- Database: {connection.vendor} `{db.get('NAME')}`; Python {platform.python_version()}",
        f"- Target: {report.target}"
        + (
            " (real HTTP servers on 127.0.0.1 for the OpenAI stand-in, CRM, outbox, MCP)"
            if report.target == "sandbox"
            else " (no control routes used; reversible or read-only test actions)"
        ),
        "",
        "## Result",
        "",
        f"- Drills run: **{totals['drills']}** ({totals['passed']} passed, {totals['failed']} failed; "
        f"{totals['not_applicable']} not applicable to their mechanism)",
        f"- Faults injected: **{totals['faults']}** ({len(faults)} kinds)",
        f"- Work items followed: {totals['items']}; external actions seen at the external systems: "
        f"{totals['external_actions']}",
        f"- Items lost: **{totals['lost']}** (must be 0)",
        f"- Actions after the boundary: **{totals['after_boundary']}** (must be 0)",
        f"- Audit gaps: **{totals['audit_gaps']}** (must be 0)",
        "",
        "An item is lost when it is left unsettled, or when an external system holds an effect that the",
        "ledger records as cancelled or failed (without a late-result review flag) or that no item claims.",
        "An action is after the boundary when an item started or submitted after the task's",
        "stop_requested_at, or when an external system received an action after the stop from an item",
        "that never passed the boundary or had already sent its one submission.",
        "",
        "## Drills",
        "",
        markdown_table(report),
        "",
        "## Faults injected",
        "",
        *[f"- {f}" for f in faults],
        "",
    ]
    if report.cleanup:
        lines += ["## Reversed at the end", ""]
        lines += [f"- {line}" for line in report.cleanup]
        lines.append("")
    failed = [o for o in report.ran if not o.passed]
    if failed:
        lines += ["## What failed", ""]
        for o in failed:
            lines.append(f"- {o.drill} / {o.mechanism}: expected {o.expected}; observed {o.observed}")
            lines += [f"  - {v}" for v in o.violations]
        lines.append("")
    lines += _faults_section(fault_results)
    notes = [(o, n) for o in report.ran for n in o.notes]
    if notes:
        lines += ["## What the agent side reported", ""]
        lines += [f"- {o.drill} / {o.mechanism}: {n}" for o, n in notes]
        lines.append("")
    return "\n".join(lines)


def write(report: Report, path: Path, *, command: str, fault_results: Path | None = None) -> Path:
    path.write_text(render(report, command=command, fault_results=fault_results))
    return path
