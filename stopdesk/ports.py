"""What the ledger needs from reconcile, which sits above it: typed callables that reconcile
registers in `ReconcileConfig.ready()`. The ledger calls a port; it never names reconcile's tasks
or modules in strings, and never imports them.

- `cancellations_dispatch(item_ids)`: queue the cancellation of the items that were in flight when
  a Stop committed (`services/stop.py`).
- `registration_check(mechanism=, kind=, detail=)`: the readiness policy's check before an item is
  registered; raises to refuse (`services/items.py`).
- `tasks_with_open_work()`: a query of the ids of tasks whose compensation is under way or whose
  escalation is open; an archived month must keep their events (`services/partitions.py`).

A port called before anything registered it raises `PortNotRegistered`, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet


class PortNotRegistered(RuntimeError):
    pass


class Port[**P, R]:
    """One callable the ledger needs, declared by a stub that gives its signature and meaning."""

    def __init__(self, stub: Callable[P, R]) -> None:
        self.name = stub.__name__.lstrip("_")
        self.__doc__ = stub.__doc__
        self._impl: Callable[P, R] | None = None

    def register(self, impl: Callable[P, R]) -> None:
        self._impl = impl

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._impl is None:
            raise PortNotRegistered(
                f"the ledger's port {self.name!r} is not registered: is the 'reconcile' app in INSTALLED_APPS?"
            )
        return self._impl(*args, **kwargs)


def _cancellations_dispatch(item_ids: list[int]) -> None:
    """Queue the cancellation of these in-flight items (after the stop's transaction commits)."""


def _registration_check(*, mechanism: str, kind: str, detail: dict[str, Any] | None) -> None:
    """Raise to refuse registering an item of this mechanism and kind (the readiness policy)."""


def _tasks_with_open_work() -> QuerySet[Any, int]:
    """The ids of the tasks with a compensation under way or an open escalation, as a query."""
    raise NotImplementedError


cancellations_dispatch = Port(_cancellations_dispatch)
registration_check = Port(_registration_check)
tasks_with_open_work = Port(_tasks_with_open_work)
