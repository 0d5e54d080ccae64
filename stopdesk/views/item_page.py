"""What the item page reads: one work item with everything a person needs to decide about it, in
a fixed number of queries (its records and their compensations, its attempts, a bounded window of
its events and children)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Prefetch

from reconcile.models import Compensation, Escalation
from reconcile.services.report import item_reportable, report_deadline
from stopdesk.models import CancellationAttempt, Event, ExternalRecord, WorkItem
from stopdesk.states import TERMINAL, ItemState

S = ItemState
EVENT_LIMIT = 200
CHILD_LIMIT = 20


@dataclass(frozen=True)
class ToolCall:
    """The tool an item called and its arguments, wherever the runtime put them in `detail`."""

    name: str
    server: str = ""
    arguments: Any = None
    protocol: str = ""  # MCP: the revision and transport used, and how a cancel travels on them


@dataclass
class Moment:
    """One of the item's times, and which side of Stop it falls on."""

    what: str
    at: datetime | None
    side: str = ""  # "before Stop", "after Stop", or "" when there was no Stop or no time


@dataclass
class ItemPage:
    item: WorkItem
    records: list[ExternalRecord]
    attempts: list[CancellationAttempt]
    events: list[Event]
    event_count: int
    children: list[WorkItem]
    child_count: int
    escalations: list[Escalation]
    tool: ToolCall | None
    moments: list[Moment]
    stop_at: datetime | None
    reportable: bool
    report_by: datetime | None
    late: dict[str, Any] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return self.item.state in TERMINAL

    @property
    def uncertain(self) -> bool:
        return self.item.state == S.UNCERTAIN

    @property
    def late_waiting(self) -> bool:
        """A late result nobody has reviewed yet (an uncertain item is resolved instead)."""
        return self.item.needs_review and not self.uncertain

    @property
    def evidence(self) -> dict[str, Any]:
        """The item's evidence without the parts the page shows on their own (the late report)."""
        return {k: v for k, v in self.item.evidence.items() if k != "late_result"}

    @property
    def late_detail(self) -> dict[str, Any]:
        return {k: v for k, v in self.late.items() if k not in ("reported", "outcome")}


def tool_call(detail: dict[str, Any]) -> ToolCall | None:
    """The shapes the agent side records: {"tool": {"name", "arguments"}} (the framework
    integrations), {"mcp": {"tool", "server"...}} (MCP calls), {"tool", "arguments"} (flat)."""
    tool = detail.get("tool")
    if isinstance(tool, dict) and tool.get("name"):
        return ToolCall(str(tool["name"]), str(tool.get("server") or ""), tool.get("arguments"))
    mcp = detail.get("mcp")
    if isinstance(mcp, dict) and mcp.get("tool"):
        check = mcp.get("status_check")
        check = check if isinstance(check, dict) else {}
        server = mcp.get("server") or mcp.get("name") or mcp.get("server_name") or ""
        return ToolCall(str(mcp["tool"]), str(server), mcp.get("arguments", check.get("arguments")), _protocol(mcp))
    if isinstance(tool, str) and tool:
        return ToolCall(tool, str(detail.get("server") or ""), detail.get("arguments"))
    return None


def _protocol(mcp: dict[str, Any]) -> str:
    revision = mcp.get("revision") or mcp.get("protocol_version")
    if not revision:
        return ""
    said = f"MCP {revision}"
    if mcp.get("transport"):
        said += f" over {str(mcp['transport']).replace('_', ' ')}"
    if mcp.get("cancel_wire"):
        said += f"; on Stop, cancelled by: {mcp['cancel_wire']}"
    return said


def _side(at: datetime | None, stop_at: datetime | None) -> str:
    if at is None or stop_at is None:
        return ""
    return "before Stop" if at < stop_at else "after Stop"


def item_moments(item: WorkItem, stop_at: datetime | None) -> list[Moment]:
    moments = [Moment("Registered", item.created_at, _side(item.created_at, stop_at))]
    moments.append(Moment("Started", item.started_at, _side(item.started_at, stop_at)))
    if item.submitted_at is not None:
        moments.append(Moment("External action sent", item.submitted_at, _side(item.submitted_at, stop_at)))
    if item.cancel_requested_at is not None:
        moments.append(Moment("Cancel requested", item.cancel_requested_at, ""))
    moments.append(Moment("Ended", item.finished_at, _side(item.finished_at, stop_at)))
    return moments


def item_page(item: WorkItem) -> ItemPage:
    records = list(
        ExternalRecord.objects.filter(item=item)
        .prefetch_related(Prefetch("compensations", queryset=Compensation.objects.order_by("proposed_at", "id")))
        .order_by("id")
    )
    events = Event.objects.filter(item=item).order_by("at", "id")
    children = WorkItem.objects.filter(parent=item).order_by("id")
    stop_at = item.task.stop_requested_at
    return ItemPage(
        item=item,
        records=records,
        attempts=list(CancellationAttempt.objects.filter(item=item).order_by("sent_at", "id")),
        # The latest ones when there are many (a watched cancel writes one per look): what
        # happened last is what a decision needs; the whole trail is in the audit log.
        events=list(reversed(events.reverse()[:EVENT_LIMIT])),
        event_count=events.count(),
        children=list(children[:CHILD_LIMIT]),
        child_count=children.count(),
        escalations=list(Escalation.objects.filter(item=item).select_related("to", "by").order_by("at", "id")),
        tool=tool_call(item.detail or {}),
        moments=item_moments(item, stop_at),
        stop_at=stop_at,
        reportable=item_reportable(item),
        report_by=report_deadline(item),
        late=dict(item.evidence.get("late_result") or {}),
    )
