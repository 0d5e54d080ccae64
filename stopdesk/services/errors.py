from stopdesk.protocol.errors import StopRequested
from stopdesk.protocol.errors import TaskClosed as ClientTaskClosed


class LedgerError(Exception):
    """Base for refusals the caller should show to a person or a runtime."""

    code = "ledger_error"


class TaskStopped(LedgerError, StopRequested):
    """Stop was requested for the task: the work must not start and was marked cancelled.

    A StopRequested, the one class every door raises after Stop (the HTTP client, LocalRuntime,
    LedgerTask.raise_if_stopped, the agent helpers), so agent code catches one thing."""

    code = "task_stopped"

    def __init__(self, task_id: int, item_id: int | None = None) -> None:
        super().__init__(
            f"Task {task_id} was stopped; item {item_id} was not started and is cancelled.", task=task_id, item=item_id
        )


class TaskClosed(LedgerError, ClientTaskClosed):
    """The task is closed: nothing new is registered on it, and nothing was written."""

    code = "task_closed"

    def __init__(self, task_id: int) -> None:
        super().__init__(
            f"Task {task_id} is closed; it takes no new work. Create a new task for new work.", task=task_id
        )


class Held(LedgerError):
    """A registration's hold (`Hold`, the MCP gateway's retry gate) named an earlier item that
    holds it back: nothing was written."""

    code = "held"

    def __init__(self, item_id: int) -> None:
        super().__init__(f"Held back by item {item_id}; nothing was registered.")
        self.item_id = item_id


class InvalidRecordId(LedgerError):
    """The record id cannot travel back to its system as one URL path segment."""

    code = "invalid_record_id"


class IllegalTransition(LedgerError):
    code = "illegal_transition"

    def __init__(self, item_id: int, current: str, wanted: str) -> None:
        self.item_id = item_id
        self.current = current
        self.wanted = wanted
        super().__init__(f"Item {item_id} is {current}; it cannot move to {wanted}.")


class ToolNotReady(LedgerError):
    """The readiness policy refused to register an item: its tool cannot account for the work
    it would submit (a missing capability, or a failed latest drill)."""

    code = "tool_not_ready"

    def __init__(self, tool: str, missing: list[str], reasons: list[str] | None = None) -> None:
        self.tool = tool
        self.missing = missing
        self.reasons = reasons or []
        super().__init__(
            f"Tool {tool} cannot account for its submitted work; missing: {', '.join(missing)}. "
            "The readiness policy (STOPDESK_READINESS_POLICY) refuses items for it."
        )


class UnknownMechanism(LedgerError):
    """An item named a mechanism no adapter handles: it could never be cancelled or looked up."""

    code = "unknown_mechanism"

    def __init__(self, mechanism: str, known: list[str]) -> None:
        self.mechanism = mechanism
        super().__init__(f"Unknown mechanism {mechanism!r}; expected one of {', '.join(known)}.")


class HandleConflict(LedgerError):
    """The item already has another handle: a handle names one piece of dispatched work."""

    code = "handle_conflict"

    def __init__(self, item_id: int, handle: str) -> None:
        self.item_id = item_id
        self.handle = handle
        super().__init__(f"Item {item_id} already has the handle {handle!r}; one item is one dispatched piece of work.")


class DeclarationRefused(LedgerError):
    """An item's declaration tried to choose where the server connects (a URL, host, header or
    credential): that is configuration, never runtime input. `field` names the offending key."""

    code = "declaration_refused"

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")
