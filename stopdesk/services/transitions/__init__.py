"""The one place that writes a work item's state, always with its audit event.

- `single`: `item_transition` (one item: lock, check the move, write the allowed fields, append
  the event through `stopdesk.services.events.event_record`), `item_late_result` (a result
  that contradicts a recorded outcome: evidence, review flag and event, state untouched) and
  `item_close_running` (a running item's result and its event in one statement; with the settle
  check skipped while an item the caller holds open keeps the task unsettled) and
  `task_settle_check`;
- `sets`: `items_move` (any number of items in one statement with their events, checked against
  the from-state in its WHERE) and `items_schedule` (next check and progress, guarded by the
  state the caller decided on; not a move, so no event);
- `boundary`: `item_start` and `item_submit`, the cancellation boundary (one statement on
  PostgreSQL that checks Stop and moves the item, with its event), `item_register_pass`, a new
  child registered and passed through it in one statement (a framework's tool call; a `Hold`, such
  as the MCP gateway's retry gate, checked first in the same statement), and
  `item_observed_started` for work found already running outside it (with the time it began);
- `gate`: the per-task advisory lock that starts hold shared and Stop exclusive (PostgreSQL), so
  a task's starts overlap and a waiting Stop is not starved;
- `settled`: the task's `settled_at` that follows from its items' states, with its event, written
  after the move that settled the last item commits, and by a periodic sweep (`tasks_settle_sweep`)
  for a check that never ran or raced.

Every move is one of `stopdesk.states.TRANSITIONS`; states are named through `ItemState`, never as
string literals, and the columns a move may set besides the state are `FIELDS`. Both PostgreSQL
(statements built for it) and SQLite (portable twins) are tested.
"""

from stopdesk.services.transitions.boundary import (
    Hold,
    Refused,
    Then,
    item_observed_started,
    item_register_pass,
    item_register_pass_async,
    item_start,
    item_submit,
)
from stopdesk.services.transitions.gate import task_gate_exclusive, task_gate_shared
from stopdesk.services.transitions.sets import NOW, Row, Schedule, items_move, items_schedule
from stopdesk.services.transitions.settled import tasks_settle_async, tasks_settle_sweep
from stopdesk.services.transitions.single import (
    FIELDS,
    item_close_running,
    item_close_running_async,
    item_close_running_of_runtime_async,
    item_late_result,
    item_late_result_record,
    item_transition,
    task_settle_check,
)

__all__ = [
    "FIELDS",
    "NOW",
    "Hold",
    "Refused",
    "Row",
    "Schedule",
    "Then",
    "item_close_running",
    "item_close_running_async",
    "item_close_running_of_runtime_async",
    "item_late_result",
    "item_late_result_record",
    "item_observed_started",
    "item_register_pass",
    "item_register_pass_async",
    "item_start",
    "item_submit",
    "item_transition",
    "items_move",
    "items_schedule",
    "task_gate_exclusive",
    "task_gate_shared",
    "task_settle_check",
    "tasks_settle_async",
    "tasks_settle_sweep",
]
