"""docs/RELIABILITY.md, written from a real drill run (never by hand)."""

from __future__ import annotations

import platform
from pathlib import Path

from django.db import connection
from django.utils import timezone

from reconcile.drills.runner import Report
from reconcile.drills.table import markdown_table


def render(report: Report, *, command: str) -> str:
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
        f"- Target: {report.target} (real HTTP servers on 127.0.0.1 for the OpenAI stand-in, CRM, outbox, MCP)",
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
    notes = [(o, n) for o in report.ran for n in o.notes]
    if notes:
        lines += ["## What the agent side reported", ""]
        lines += [f"- {o.drill} / {o.mechanism}: {n}" for o, n in notes]
        lines.append("")
    return "\n".join(lines)


def write(report: Report, path: Path, *, command: str) -> Path:
    path.write_text(render(report, command=command))
    return path
