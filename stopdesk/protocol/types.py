"""What both doors return: plain dataclasses built from the API's JSON, so agent code reads the
same attributes from the HTTP client and from the in-process LocalRuntime."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

MAX_RESULTS = 100  # the results one `write_results` request (POST /results) may carry


class _Json:
    _datetimes: ClassVar[frozenset[str]] = frozenset()
    _nested: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name in cls._datetimes and isinstance(value, str):
                value = datetime.fromisoformat(value)
            elif f.name in cls._nested and value is not None:
                value = [cls._nested[f.name].from_json(v) for v in value]
            values[f.name] = value
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif f.name in self._nested:
                value = [v.to_json() for v in value]
            out[f.name] = value
        return out


@dataclass(frozen=True)
class TaskInfo(_Json):
    id: int
    title: str
    created_at: datetime | None = None
    stop_requested_at: datetime | None = None
    settled_at: datetime | None = None
    stopped: bool = False
    # Closed: the runtime said the task is over, or it stayed idle past the timeout; it takes no
    # new work. A task whose items have all settled is not closed by that alone.
    closed_at: datetime | None = None
    closed: bool = False

    _datetimes = frozenset({"created_at", "stop_requested_at", "settled_at", "closed_at"})


@dataclass(frozen=True)
class ItemInfo(_Json):
    id: int
    task: int
    kind: str
    noun: str
    state: str
    parent: int | None = None
    mechanism: str = "manual"
    handle: str = ""
    idempotency_key: str = ""
    noun_plural: str = ""
    label: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    submitted_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_until: datetime | None = None
    worker: str = ""
    cancel_requested_at: datetime | None = None
    investigate_by: datetime | None = None
    outcome: str = ""
    needs_review: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)

    _datetimes = frozenset(
        {
            "created_at",
            "updated_at",
            "started_at",
            "submitted_at",
            "finished_at",
            "heartbeat_at",
            "lease_until",
            "cancel_requested_at",
            "investigate_by",
        }
    )


@dataclass(frozen=True)
class TaskDetail(TaskInfo):
    """A task with its counts by state, its items and its summary sentence."""

    counts: dict[str, int] = field(default_factory=dict)
    items: list[ItemInfo] = field(default_factory=list)
    items_truncated: bool = False
    summary: str = ""

    _nested = {"items": ItemInfo}


@dataclass(frozen=True)
class RecordInfo(_Json):
    id: int
    item: int
    system: str
    record_id: str
    effect: str
    version: str = ""
    reversible: bool = False
    reversal: str = ""
    link: str = ""
    recorded_at: datetime | None = None

    _datetimes = frozenset({"recorded_at"})


@dataclass(frozen=True)
class StopInfo(_Json):
    """The task's one stop request. `created` is false for every Stop after the first."""

    task: int
    requested_at: datetime
    actor: str
    created: bool
    reason: str = ""
    queued_cancelled: int = 0
    dispatched: int = 0
    duplicates: int = 0

    _datetimes = frozenset({"requested_at"})


@dataclass(frozen=True)
class HeartbeatInfo(_Json):
    item: int
    state: str
    stop_requested: bool
    lease_until: datetime | None = None

    _datetimes = frozenset({"lease_until"})


@dataclass(frozen=True)
class StopWatchInfo(_Json):
    """The answer of a stop watch: `stopped` is true the moment the task's Stop committed, false
    when the watch timed out first (watch again)."""

    task: int
    stopped: bool
    stop_requested_at: datetime | None = None

    _datetimes = frozenset({"stop_requested_at"})


@dataclass(frozen=True)
class StartedInfo(_Json):
    """A work item registered and through the boundary in one request (`register_started`)."""

    id: int
    task: int


@dataclass(frozen=True)
class ResultInfo(_Json):
    """A result received (`finish_fast`): the item's answer is not read back."""

    item: int
    status: str


@dataclass(frozen=True)
class ResultsInfo(_Json):
    """Several results received in one request (`write_results`): the items they were for."""

    items: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class LaunchedInfo(_Json):
    """The tool calls a model response launched, recorded under its item (`record_launched`):
    the ids of the items created now; a call already recorded (by call id) is not recorded again."""

    item: int
    created: list[int] = field(default_factory=list)
