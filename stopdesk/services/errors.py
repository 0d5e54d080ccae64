class LedgerError(Exception):
    """Base for refusals the caller should show to a person or a runtime."""

    code = "ledger_error"


class TaskStopped(LedgerError):
    """Stop was requested for the task: the work must not start and was marked cancelled."""

    code = "task_stopped"

    def __init__(self, task_id: int, item_id: int | None = None) -> None:
        self.task_id = task_id
        self.item_id = item_id
        super().__init__(f"Task {task_id} was stopped; item {item_id} was not started and is cancelled.")


class IllegalTransition(LedgerError):
    code = "illegal_transition"

    def __init__(self, item_id: int, current: str, wanted: str) -> None:
        self.item_id = item_id
        self.current = current
        self.wanted = wanted
        super().__init__(f"Item {item_id} is {current}; it cannot move to {wanted}.")
