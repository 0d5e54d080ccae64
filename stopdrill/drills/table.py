"""The drill table, as plain text: one row per drill and mechanism, then each item's final state."""

from __future__ import annotations

from collections.abc import Iterable

from stopdrill.drills.runner import Outcome, Report

HEADERS = ("drill", "mechanism", "expected", "observed", "result")


def _row(o: Outcome) -> tuple[str, ...]:
    return (o.drill, o.mechanism, o.expected, o.observed, o.verdict)


def table(report: Report, *, items: bool = True) -> str:
    rows = [_row(o) for o in report.outcomes]
    widths = [max(len(h), *(len(r[n]) for r in rows)) if rows else len(h) for n, h in enumerate(HEADERS)]

    def line(cells: Iterable[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(HEADERS), line("-" * w for w in widths)]
    for outcome in report.outcomes:
        out.append(line(_row(outcome)))
        if not items:
            continue
        for item in outcome.items:
            parent = f" (child of #{item['parent']})" if item.get("parent") else ""
            out.append(
                f"    #{item['id']} {item['noun']} via {item['mechanism']}{parent}: {item['label']}"
                f"  [{' > '.join(item['path'])}]"
            )
        for violation in outcome.violations:
            out.append(f"    ! {violation}")
        out.extend(f"    ({note})" for note in outcome.notes)
    totals = report.totals()
    out.append("")
    out.append(
        f"{totals['drills']} drills, {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['not_applicable']} not applicable; {totals['faults']} faults injected; "
        f"{totals['items']} items, {totals['external_actions']} external actions; "
        f"items lost {totals['lost']}, actions after the boundary {totals['after_boundary']}, "
        f"audit gaps {totals['audit_gaps']}"
    )
    if report.target != "sandbox":
        out.append(f"Target: {report.target} (no control routes used)")
    if report.cleanup:
        out.append("Reversed at the end (every record the drills created, archived with If-Match):")
        out.extend(f"  {line}" for line in report.cleanup)
    return "\n".join(out)


def markdown_table(report: Report) -> str:
    out = ["| drill | mechanism | expected | observed | result | items (final state) |", "|---|---|---|---|---|---|"]
    for o in report.outcomes:
        states = "; ".join(f"#{i['id']} {i['noun']} {i['label']}" for i in o.items) or "-"
        out.append(f"| {o.drill} | {o.mechanism} | {o.expected} | {o.observed} | {o.verdict} | {states} |")
    return "\n".join(out)
