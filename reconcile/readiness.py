"""Tool readiness: can a tool's stop path account for all the work it submits?

A verdict comes from two kinds of evidence: what the adapter declares it can do (cancel, inspect,
reverse; `Mechanism.can`, per item where it depends on the item's declaration), and how the
tool did in its latest drill (`manage.py stopdrill`). A tool without a status lookup cannot tell
what happened to an action whose answer was lost, so its submitted work cannot be accounted for;
a tool whose latest drill failed has been seen to lose work or act after the boundary.

The tools of agent framework runs (`stopdesk.agent.frameworks`) are known from the ledger: each
call records what its tool declared (`@declare`: read-only, reversible and how, irreversible,
external system with an idempotency key) or what its MCP server's annotations say. Such a tool is
judged by that declaration; an undeclared one counts as possibly destructive, so it shows as not
ready, which is the cue to declare it or narrow the agent's tool set.

The policy (`settings.STOPDESK_READINESS_POLICY`): "off" (default), "warn" (log a refusal that
would have happened) or "enforce" (refuse to register the item: the agent's tool set is narrowed
to the tools whose stop path can account for their work). The ledger calls
`registration_check` through its `registration_check` port (`stopdesk.ports`), which this app
registers, so the ledger never imports it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from reconcile.mechanisms import folders, registry
from reconcile.mechanisms.base import Capability, ItemRef, Mechanism
from reconcile.models import DrillResult
from stopdesk.models import WorkItem
from stopdesk.services.errors import ToolNotReady
from stopdesk.states import ItemState

log = logging.getLogger(__name__)

READY = "ready"  # can inspect, and its latest drills passed
LIMITED = "limited"  # can account for its work, but cannot ask it to stop (it runs to its end)
UNTESTED = "untested"  # can account for its work on paper; no drill has run yet
NOT_READY = "not_ready"  # cannot account for its submitted work, or failed its latest drill


@dataclass(frozen=True)
class DrillEvidence:
    run_id: int
    at: datetime | None
    passed: int
    failed: list[str]

    @property
    def total(self) -> int:
        return self.passed + len(self.failed)


@dataclass
class Verdict:
    tool: str
    mechanism: str
    cancel: bool
    inspect: bool
    reverse: bool
    drill: DrillEvidence | None
    status: str = UNTESTED
    reasons: list[str] = field(default_factory=list)
    framework: str = ""  # set for a tool an agent framework run used (judged by its declaration)
    does: str = ""  # what the tool is declared to do, in words

    @property
    def missing(self) -> list[str]:
        return [r for r in self.reasons if r.startswith("missing")]


def latest_drill(mechanism: str) -> DrillEvidence | None:
    """The mechanism's rows from the latest drill run that included it."""
    latest = DrillResult.objects.filter(mechanism=mechanism).order_by("-run_id").values("run_id").first()
    if latest is None:
        return None
    rows = list(
        DrillResult.objects.filter(mechanism=mechanism, run_id=latest["run_id"]).values(
            "drill", "passed", "run__finished_at"
        )
    )
    return DrillEvidence(
        run_id=latest["run_id"],
        at=rows[0]["run__finished_at"] if rows else None,
        passed=sum(1 for r in rows if r["passed"]),
        failed=sorted(r["drill"] for r in rows if not r["passed"]),
    )


def _ref(mechanism: str, kind: str = "", detail: dict[str, Any] | None = None) -> ItemRef:
    return ItemRef(
        id=0,
        task_id=0,
        kind=kind,
        mechanism=mechanism,
        handle="",
        idempotency_key="",
        state=ItemState.QUEUED,
        detail=detail or {},
    )


def _can(adapter: Mechanism, capability: Capability, ref: ItemRef | None) -> bool:
    # Per item where it depends on the item's declaration (the configured system an HTTP operation names...).
    return adapter.can(capability, ref)


def verdict_for(
    mechanism: str, *, kind: str = "", detail: dict[str, Any] | None = None, tool: str | None = None
) -> Verdict:
    """The verdict for one tool: a mechanism, or (with `detail`) one registration of it."""
    adapter = registry.get(mechanism)
    ref = _ref(mechanism, kind, detail) if detail is not None else None
    verdict = Verdict(
        tool=tool or mechanism,
        mechanism=mechanism,
        cancel=_can(adapter, Capability.CANCEL, ref),
        inspect=_can(adapter, Capability.INSPECT, ref),
        reverse=_can(adapter, Capability.REVERSE, ref),
        drill=latest_drill(mechanism),
    )
    if not verdict.inspect:
        verdict.reasons.append("missing capability: inspect (no status lookup, so a lost answer stays unknown)")
    if verdict.drill is not None and verdict.drill.failed:
        verdict.reasons.append(
            f"missing a passing drill: failed {', '.join(verdict.drill.failed)} in drill run #{verdict.drill.run_id}"
        )
    if verdict.reasons and any(r.startswith("missing") for r in verdict.reasons):
        verdict.status = NOT_READY
    elif verdict.drill is None or verdict.drill.total == 0:
        verdict.status = UNTESTED
        verdict.reasons.append("no drill has run for it yet")
    elif not verdict.cancel:
        verdict.status = LIMITED
        verdict.reasons.append("cannot ask the work to stop; it is reconciled after it ends")
    else:
        verdict.status = READY
    return verdict


def verdicts() -> list[Verdict]:
    """Every registered mechanism, the tools each mechanism folder lists from its settings (each
    HTTP system, each MCP tool declared per server), and each tool framework runs have used (from
    the ledger)."""
    found = [verdict_for(name) for name in registry.names()]
    for name in folders.names():
        part = folders.part(name, "readiness")
        if part is None:
            continue
        for listed in part.tools(registry.mechanism_settings(name).options):
            verdict = verdict_for(name, detail=listed.detail, tool=listed.tool)
            if not verdict.inspect and listed.without_inspect:
                verdict.reasons.append(listed.without_inspect)
            found.append(verdict)
    found.extend(framework_tools())
    return found


# --- tools of framework runs, judged by what they declare ---------------------------------------


def declared_verdict(tool: dict[str, Any], *, http: dict[str, Any] | None = None) -> Verdict:
    """The verdict for a framework tool from what its call recorded (`detail.tool`, written by
    `stopdesk.agent.frameworks`: its `@declare` declaration, or an MCP server's annotations).
    Only what can be accounted for after Stop passes: a read-only tool (nothing to account for),
    an external action whose result can be looked up by its idempotency key. An undeclared tool
    counts as possibly destructive, as the integration records it."""
    framework = str(tool.get("framework") or "")
    name = str(tool.get("name") or "?")
    mcp = tool.get("mcp") if isinstance(tool.get("mcp"), dict) else None
    effect = str(tool.get("effect") or "unknown")
    system = str(tool.get("system") or "")
    verdict = Verdict(
        tool=f"{framework}:{name}" if framework else name,
        mechanism="http" if http else "manual",
        cancel=True,  # the integration cancels a call in flight when Stop arrives
        inspect=False,
        reverse=False,
        drill=latest_drill(framework) if framework else None,
        framework=framework,
    )
    why: list[str] = []
    if effect == "read_only":
        verdict.does = "read-only" + (" (the MCP server says readOnlyHint)" if mcp else "")
        verdict.status = READY
        why.append("an interrupted call changed nothing, so there is nothing to account for")
    elif system:
        keyed = " with an idempotency key" if tool.get("keyed", True) else ""
        verdict.does = f"external action on {system}{keyed}" + (
            f", reversible ({tool['reversal']})" if tool.get("reversal") else ""
        )
        lookup = verdict_for("http", detail={"http": {"system": system, **(http or {})}}, tool=verdict.tool)
        verdict.inspect, verdict.reverse = lookup.inspect, lookup.reverse
        if lookup.inspect:
            verdict.status = READY
            why.append("submitted with its key, so a call cut off by Stop is looked up")
        else:
            verdict.status = NOT_READY
            why.append(f"missing a status lookup for {system}: a call cut off by Stop stays unknown")
    elif effect == "reversible":
        verdict.does = f"reversible ({tool.get('reversal') or 'how is not said'})"
        verdict.status = LIMITED
        why.append("an interrupted call is left uncertain for review, with how to undo it")
    elif effect == "irreversible":
        verdict.does = "irreversible"
        verdict.status = NOT_READY
        why.append("missing a way to account for it: irreversible, with no external system to look the result up")
    elif mcp:
        hints = mcp.get("annotations") or {}
        verdict.does = f"served by MCP server {mcp.get('server') or '?'}; " + ", ".join(
            f"{k}={str(v).lower()}" for k, v in sorted(hints.items())
        )
        verdict.status = NOT_READY
        why.append(
            "missing readOnlyHint: a cancelled MCP call gets no answer, so it is possibly destructive and unknown"
        )
    else:
        verdict.does = "undeclared"
        verdict.status = NOT_READY
        why.append(
            "missing a declaration: treated as possibly destructive (declare it with @declare, or narrow the tool set)"
        )
    if verdict.drill is not None and verdict.drill.failed:
        verdict.status = NOT_READY
        why.append(
            f"missing a passing drill: failed {', '.join(verdict.drill.failed)} in drill run #{verdict.drill.run_id}"
        )
    verdict.reasons = why
    return verdict


# How far back the page looks for the tools framework runs used.
FRAMEWORK_TOOLS_SCAN = 5000


def framework_tools() -> list[Verdict]:
    """Each tool a framework run called, as its latest call declared it (from the ledger)."""
    rows = (
        WorkItem.objects.filter(detail__has_key="tool")
        .order_by("-id")
        .values_list("detail", flat=True)[:FRAMEWORK_TOOLS_SCAN]
    )
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for detail in rows:
        tool = detail.get("tool") if isinstance(detail, dict) else None
        if not isinstance(tool, dict) or "framework" not in tool:
            continue
        latest.setdefault((str(tool["framework"]), str(tool.get("name"))), detail)
    return [declared_verdict(detail["tool"], http=detail.get("http")) for _, detail in sorted(latest.items())]


def policy() -> str:
    mode = getattr(settings, "STOPDESK_READINESS_POLICY", "off")
    if mode not in ("off", "warn", "enforce"):
        raise ValueError(f"STOPDESK_READINESS_POLICY must be off, warn or enforce, not {mode!r}")
    return str(mode)


def registration_check(*, mechanism: str, kind: str, detail: dict[str, Any] | None, **_: Any) -> None:
    """Called by `item_register` when the policy is not off. Raises ToolNotReady under "enforce"
    when the tool cannot account for its submitted work."""
    mode = policy()
    if mode == "off":
        return
    detail = detail or {}
    if isinstance(detail.get("agent_run"), dict):
        return  # a framework's run: its integration settles it; its calls are each judged here
    if isinstance(detail.get("tool"), dict) and "framework" in detail["tool"]:
        # A framework's tool call: judged by what the tool declares, not by the "manual" mechanism.
        verdict = declared_verdict(detail["tool"], http=detail.get("http"))
        tool = verdict.tool
    else:
        tool = _tool_name(mechanism, detail)
        verdict = verdict_for(mechanism, kind=kind, detail=detail, tool=tool)
    if verdict.status != NOT_READY:
        return
    missing = [_missing_name(r) for r in verdict.missing]
    error = ToolNotReady(tool=tool, missing=missing, reasons=verdict.missing)
    if mode == "enforce":
        raise error
    log.warning("readiness policy (warn): %s", error)


def _missing_name(reason: str) -> str:
    # "missing capability: inspect (...)" -> "inspect"; "missing a passing drill: ..." -> "a passing drill"
    head, _, rest = reason.partition(":")
    if head == "missing capability":
        return rest.strip().split(" ")[0]
    return head.removeprefix("missing ").strip()


def _tool_name(mechanism: str, detail: dict[str, Any]) -> str:
    if mechanism == "http":
        system = (detail.get("http") or {}).get("system")
        return f"http:{system}" if system else "http"
    tool = (detail.get(mechanism) or {}).get("tool") if isinstance(detail.get(mechanism), dict) else None
    return f"{mechanism}:{tool}" if tool else mechanism
