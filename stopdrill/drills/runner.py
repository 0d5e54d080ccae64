"""Run drills against mechanisms, keep the results, and say whether Stop held."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.models import DrillResult, DrillRun
from stopdrill.drills import frameworks  # noqa: F401  (its drivers register on import)
from stopdrill.drills.catalogue import BY_NAME, DRILLS, Drill
from stopdrill.drills.checks import inspect_drill
from stopdrill.drills.core import DrillContext, drill_settings
from stopdrill.drills.drivers import Driver, driver_class
from stopdrill.drills.sandbox import DrillSandbox, start_drill_sandbox

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    drill: str
    mechanism: str
    tool: str
    expected: str
    observed: str
    passed: bool | None  # None: the drill does not apply to this mechanism
    items: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    task_id: int | None = None
    item_id: int | None = None
    seconds: float = 0.0
    after_boundary: int = 0
    lost: int = 0
    audit_gaps: int = 0
    external_actions: int = 0

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "n/a"}[self.passed]

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "verdict": self.verdict}


@dataclass
class Report:
    outcomes: list[Outcome]
    run: DrillRun | None = None
    target: str = "sandbox"
    # What the run undid at the end on a user's integration (each record it created, archived).
    cleanup: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed is not False for o in self.outcomes) and self.cleanup_ok

    @property
    def cleanup_ok(self) -> bool:
        """Every record created on a user's integration was reversed."""
        return not any(line.startswith("NOT archived") for line in self.cleanup)

    @property
    def ran(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.passed is not None]

    def totals(self) -> dict[str, int]:
        ran = self.ran
        return {
            "drills": len(ran),
            "passed": sum(1 for o in ran if o.passed),
            "failed": sum(1 for o in ran if not o.passed),
            "not_applicable": len(self.outcomes) - len(ran),
            "faults": sum(len(o.faults) for o in ran),
            "items": sum(len(o.items) for o in ran),
            "external_actions": sum(o.external_actions for o in ran),
            "lost": sum(o.lost for o in ran),
            "after_boundary": sum(o.after_boundary for o in ran),
            "audit_gaps": sum(o.audit_gaps for o in ran),
        }


def run_drill(drill: Drill, driver: Driver, sandbox: DrillSandbox | None, target: Any = None) -> Outcome:
    expected = driver.expected.get(drill.name)
    if drill.name in driver.not_applicable or expected is None:
        why = driver.not_applicable.get(drill.name, "no scenario for this mechanism")
        return Outcome(drill.name, driver.mechanism, driver.label, "-", "not applicable", None, notes=[why])
    if sandbox is not None:
        sandbox.reset()
    ctx = DrillContext(sandbox, driver.mechanism, drill.name, target=target)
    started = time.monotonic()
    settled = False
    crashed = ""
    try:
        ctx.new_task()
        drill.plan(ctx, driver)
        settled = ctx.settle()
        ctx.join_children()
        # The agent side may have reported after the first settle (a late result, a slow child).
        settled = ctx.settle(bound_s=4.0) and settled
    except Exception as exc:
        log.exception("drill %s on %s raised", drill.name, driver.mechanism)
        crashed = f"drill raised {type(exc).__name__}: {exc}"[:300]
    finally:
        for child in ctx.children:
            child.join(5)
        ctx.close()
    inspection = inspect_drill(ctx) if ctx.task is not None else None
    violations = list(inspection.violations) if inspection else []
    if inspection is not None:
        violations += drill.checks(ctx)
    # The first child carries the driver's expectation for the drill; further children may carry
    # their own (an MCP drill's write next to its lookup, an asyncio group's computing child).
    judged: list[tuple[Any, frozenset[str]]] = []
    for n, c in enumerate(ctx.children):
        wanted = expected if n == 0 else c.expect
        if wanted is not None:
            judged.append((c, wanted))
    reports = {i.id: i for i in inspection.items} if inspection is not None else {}
    named = len(judged) > 1
    observed_parts, expected_parts, met = [], [], bool(judged)
    for child, wanted in judged:
        found = reports.get(child.item_id)
        label = found.label if found is not None else "no item"
        met = met and found is not None and label in wanted
        prefix = f"{child.name or (found.noun if found else 'child')} " if named else ""
        observed_parts.append(prefix + label)
        expected_parts.append(prefix + " or ".join(sorted(wanted)))
    observed = "; ".join(observed_parts) or "no child"
    if not settled and not crashed:
        observed += " (not settled in time)"
    passed = not crashed and settled and not violations and met
    return Outcome(
        drill=drill.name,
        mechanism=driver.mechanism,
        tool=driver.label,
        expected="; ".join(expected_parts),
        observed=crashed or observed,
        passed=bool(passed),
        items=[i.to_json() for i in inspection.items] if inspection else [],
        violations=violations,
        faults=ctx.faults,
        notes=ctx.notes,
        task_id=ctx.task.pk if ctx.task else None,
        item_id=ctx.children[0].item_id if ctx.children else None,
        seconds=round(time.monotonic() - started, 2),
        after_boundary=len(inspection.after_boundary) if inspection else 0,
        lost=len(inspection.lost) if inspection else 0,
        audit_gaps=len(inspection.audit) if inspection else 0,
        external_actions=inspection.external_actions if inspection else 0,
    )


def drivers_for(mechanisms: list[str] | None) -> tuple[list[Driver], list[str]]:
    """Drivers for the named mechanisms (default: every registered one), and the names without one.
    The framework drivers (openai-agents, pydantic-ai, langgraph, claude-agent-sdk) are not mechanisms, so they run
    only when named."""

    names = mechanisms or registry.names()
    found, missing = [], []
    for name in names:
        cls = driver_class(name)
        if cls is None:
            missing.append(name)
        else:
            found.append(cls())
    return found, missing


def run_drills(
    *,
    drills: list[str] | None = None,
    mechanisms: list[str] | None = None,
    sandbox: DrillSandbox | None = None,
    store: bool = True,
    progress: Any = None,
    settings_overrides: dict[str, dict[str, Any]] | None = None,
    target: Any = None,
) -> Report:
    """Run each drill against each mechanism, on the sandbox (started here unless given), or,
    with `target` (`external.Integration`), against a user's own integration: only its drivers,
    no sandbox, and every record the drills created is reversed at the end."""
    chosen = [BY_NAME[name] for name in drills] if drills else DRILLS
    own_sandbox = sandbox is None and target is None
    if own_sandbox:
        sandbox = start_drill_sandbox()
    label = target.label if target is not None else "sandbox"
    run = DrillRun.objects.create(target=label[:64]) if store else None
    outcomes: list[Outcome] = []
    cleanup: list[str] = []
    missing: list[str] = []
    overrides = {**(settings_overrides or {}), **(target.settings_overrides() if target is not None else {})}
    if sandbox is not None and target is None:
        overrides = {**sandbox.endpoints(), **overrides}
    try:
        with drill_settings(overrides):
            if target is not None:
                drivers = target.drivers(mechanisms)
            else:
                drivers, missing = drivers_for(mechanisms)
            try:
                for driver in drivers:
                    for drill in chosen:
                        outcome = run_drill(drill, driver, sandbox, target)
                        outcomes.append(outcome)
                        if progress is not None:
                            progress(outcome)
            finally:
                if target is not None:
                    cleanup = target.reverse_all()
            for name in missing:
                outcomes.append(
                    Outcome("-", name, name, "-", "not drilled", None, notes=["no drill driver for this mechanism"])
                )
    finally:
        if own_sandbox and sandbox is not None:
            sandbox.stop()
    report = Report(outcomes, run, target=label, cleanup=cleanup)
    if run is not None:
        _store(run, report)
    return report


def _store(run: DrillRun, report: Report) -> None:
    run.finished_at = timezone.now()
    run.passed = report.passed
    run.results = [o.to_json() for o in report.outcomes]
    run.save(update_fields=["finished_at", "passed", "results"])
    DrillResult.objects.bulk_create(
        [
            DrillResult(
                run=run,
                drill=o.drill,
                mechanism=o.mechanism,
                expected=o.expected,
                observed=o.observed,
                passed=bool(o.passed),
                items=o.items,
                task_id=o.task_id,
                related_item_id=o.item_id or None,
            )
            for o in report.ran
        ]
    )
