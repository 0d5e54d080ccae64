"""The in-process runtime, with the two calls a framework run makes most, each one round trip.

`LocalRuntime` answers the same methods as the HTTP client. A framework run also uses:
- `register_started(...)`: register a tool call or model request and pass the boundary in one
  transaction (one commit on the tool's path instead of two);
- `task_stopped(task_id)`: one indexed read, for watching Stop without building the task's detail;
- `record_launched(item_id, calls)`: tool calls a model response ran itself, as children of the
  response's item (the service the OpenAI adapter's read-back uses, so each call once).
"""

from __future__ import annotations

from typing import Any

from reconcile.services.launched import response_launched_record
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.client.errors import StopRequested
from stopdesk.services.errors import TaskStopped
from stopdesk.services.items import item_register_started
from stopdesk.states import ItemState


class FrameworkRuntime(LocalRuntime):
    def register_started(
        self, task_id: int, *, submit_key: str = "", worker: str | None = None, **register: Any
    ) -> int:
        self._task(task_id)  # scoped: another runtime's task is NotFound
        try:
            return item_register_started(
                task_id=task_id,
                actor=self.actor,
                worker=self.worker if worker is None else worker,
                submit_key=submit_key,
                **register,
            )
        except TaskStopped as exc:
            raise StopRequested(str(exc), task=task_id, item=exc.item_id, state=ItemState.CANCELLED) from exc

    def task_stopped(self, task_id: int) -> bool:
        return self._tasks().filter(pk=task_id, stop_requested_at__isnull=False).exists()

    def record_launched(self, item_id: int, calls: list[dict[str, Any]]) -> list[int]:
        self._check_item(item_id)  # scoped, as every item call
        return response_launched_record(item_id=item_id, calls=calls, actor=self.actor)
