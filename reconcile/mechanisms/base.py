"""The adapter contract: what a mechanism can do, how it is configured, and what it reports.

An adapter does I/O and nothing else. It never touches the ORM and never decides a state: it is
given an `ItemRef` (a plain snapshot of the work item) and returns an `Observation` (what the
remote side said, in our vocabulary). `reconcile.engine` decides; `reconcile.services` record.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, ClassVar

from stopdesk.states import ItemState


class Capability(enum.StrEnum):
    CANCEL = "cancel"  # can ask the remote side to stop
    INSPECT = "inspect"  # can look up the actual result (status lookup / read-back)
    REVERSE = "reverse"  # can undo a completed effect (compensation; run only with approval)


class Seen(enum.StrEnum):
    """What an observation says about the remote work, whatever the mechanism's own words."""

    RUNNING = "running"  # still queued or working over there
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # the remote side confirmed it stopped
    NO_EFFECT = "no_effect"  # stopped with nothing to reconcile (a read-only call, an action that never landed)
    UNREACHABLE = "unreachable"  # timeout, 5xx, connection refused: try again later
    UNKNOWABLE = "unknowable"  # no lookup exists and no answer will come: a person must find out
    AWAITING_REPORT = "awaiting_report"  # nothing to ask; wait for the runtime to report


FINAL_SEEN = frozenset({Seen.COMPLETED, Seen.FAILED, Seen.CANCELLED, Seen.NO_EFFECT})
# What a final ledger state says, for the adapters whose work records its own end in the ledger.
LEDGER_FINAL: dict[str, Seen] = {
    ItemState.COMPLETED: Seen.COMPLETED,
    ItemState.FAILED: Seen.FAILED,
    ItemState.CANCELLED: Seen.CANCELLED,
}


@dataclass(frozen=True)
class RecordFact:
    """An effect in another system, as the lookup reported it."""

    system: str
    record_id: str
    version: str = ""
    effect: str = "created"
    reversible: bool = False
    reversal: str = ""
    link: str = ""


@dataclass(frozen=True)
class Observation:
    seen: Seen
    remote_status: str = ""  # the mechanism's own word: "in_progress", "working", "HTTP 500"...
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    record: RecordFact | None = None
    cancel_sent: bool = False  # a cancel reached the remote side and was answered
    outcome: str = ""  # the item's outcome wording when this observation settles it (default: the engine's)
    if_deadline: str = ""  # why the item is uncertain if this is still the answer at the deadline

    @property
    def final(self) -> bool:
        return self.seen in FINAL_SEEN


@dataclass(frozen=True)
class ItemRef:
    """What an adapter may know about a work item: a snapshot, no ORM."""

    id: int
    task_id: int
    kind: str
    mechanism: str
    handle: str
    idempotency_key: str
    state: str
    detail: dict[str, Any]
    started_at: datetime | None = None
    submitted_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_until: datetime | None = None
    cancel_requested_at: datetime | None = None
    worker: str = ""

    @classmethod
    def of(cls, item: Any) -> ItemRef:
        names = {f.name for f in fields(cls)}
        return cls(**{name: getattr(item, name) for name in names})


@dataclass(frozen=True)
class MechanismSettings:
    """Per-mechanism timing. Defaults live in each adapter; settings.STOPDESK_MECHANISMS overrides."""

    call_timeout_s: float = 10.0  # one remote call
    deadline_s: float = 300.0  # from the cancel request (or the first check) to `uncertain`
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    recheck_interval_s: float = 5.0  # while the remote side is still running
    recheck_after_cancelled_s: float = 0.0  # keep watching a `cancelled` for a flip this long (the window)
    # The watch's schedule: read back after `watch_first_s` (None: the smaller of recheck_interval_s
    # and a third of the window), then each interval `watch_growth` times the last (5 s, 15 s,
    # 45 s...), never past the window. A flip is likeliest soon after the cancel; 1.0 reads evenly.
    watch_first_s: float | None = None
    watch_growth: float = 3.0
    investigate_by_hours: float | None = None  # None: STOPDESK["INVESTIGATE_BY_HOURS"]
    concurrency: int = 32  # cancellations in flight at once in one canceller process
    options: dict[str, Any] = field(default_factory=dict)  # adapter-specific (base_url, api key...)

    def merged(self, overrides: dict[str, Any]) -> MechanismSettings:
        known = {f.name for f in fields(self)} - {"options"}
        unknown = set(overrides) - known - {"options"}
        if unknown:
            raise ValueError(f"unknown mechanism setting(s): {sorted(unknown)}")
        values = {k: v for k, v in overrides.items() if k in known}
        return replace(self, **values, options={**self.options, **overrides.get("options", {})})


class Mechanism:
    """Base adapter. Subclasses set `name`, `capabilities`, `defaults` and implement what they claim."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    defaults: ClassVar[MechanismSettings] = MechanismSettings()

    def __init__(
        self, settings: MechanismSettings | None = None, peers: Callable[[str], Mechanism] | None = None
    ) -> None:
        self.settings = settings or self.defaults
        self._peers = peers

    def peer(self, name: str) -> Mechanism:
        """Another adapter, built with its settings (given by the registry, which builds both)."""
        if self._peers is None:
            raise LookupError(f"{self.name} was built without a registry; it cannot reach {name!r}")
        return self._peers(name)

    def can(self, capability: Capability, item: ItemRef | None = None) -> bool:
        """Whether this adapter can do `capability` (for `item`, when it depends on what the
        item declared, e.g. an HTTP operation with or without a cancel endpoint)."""
        return capability in self.capabilities

    def cancel(self, item: ItemRef) -> Observation:
        """Ask the remote side to stop, then read back. Must not raise for remote failures."""
        return self.inspect(item)

    def inspect(self, item: ItemRef) -> Observation:
        """Look up the actual result. Must not raise for remote failures."""
        return Observation(Seen.AWAITING_REPORT, message=f"{self.name} has no status lookup")

    def cancel_is_final(self, item: ItemRef) -> bool:
        """Whether one answered cancel is enough, so later passes only read back (no second effect)."""
        return True


@dataclass(frozen=True)
class ListedTool:
    """A tool of a mechanism the readiness page lists on its own (a mechanism folder's
    `readiness.tools(options)` names them from its settings): judged as an item with `detail`."""

    tool: str
    detail: dict[str, Any]
    # Added to the verdict's reasons when the tool cannot be inspected.
    without_inspect: str = ""
