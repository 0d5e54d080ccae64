"""The common pattern as a context manager: pass the boundary, make the external call, then attach
the record it produced, or mark the item uncertain when the call's outcome is unknown.

    with runtime.external_action(item.id, idempotency_key="crm-create-42") as action:
        record = crm.create(..., idempotency_key="crm-create-42")
        action.record(system="crm", record_id=record["id"], version=record["version"], effect="created",
                      reversible=True, reversal="archive")

Entering submits (raises StopRequested after a stop: the body never runs). Leaving normally
finishes the item completed. Leaving with an exception marks it uncertain, because a call that
raised may still have landed on the other side; the exception propagates. Exceptions listed in
`failures` (definite refusals, e.g. a 4xx) finish it failed instead, and a record that was already
attached means the effect is known, so the item completes. `action.fail(...)` and
`action.uncertain(...)` set the verdict without raising.

It takes any object with the runtime methods, so it works the same over the HTTP client and the
in-process LocalRuntime.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from stopdesk.protocol.types import ItemInfo, RecordInfo
from stopdesk.states import ItemState


class _Verdict:
    """What the sync and async context managers share: their arguments and the verdict."""

    def __init__(
        self,
        runtime: Any,
        item_id: int,
        *,
        idempotency_key: str,
        worker: str | None = None,
        failures: tuple[type[BaseException], ...] = (),
        complete: bool = True,
    ) -> None:
        self.runtime = runtime
        self.idempotency_key = idempotency_key
        self.worker = worker
        self.item_id = item_id
        self.failures = failures
        self.complete = complete
        self.item: ItemInfo | None = None
        self.records: list[RecordInfo] = []
        self._verdict: tuple[str, str] | None = None

    def fail(self, detail: str) -> None:
        """The other side refused definitively: nothing happened there."""
        self._verdict = ("failed", detail)

    def uncertain(self, detail: str) -> None:
        """We cannot tell whether it happened; a person or the reconciler must find out."""
        self._verdict = ("uncertain", detail)

    def _decide(self, exc: BaseException | None) -> tuple[str, str] | None:
        if exc is not None:
            if self.records:
                return (ItemState.COMPLETED, f"record attached; then {type(exc).__name__}: {exc}"[:200])
            if isinstance(exc, self.failures):
                return (ItemState.FAILED, f"{type(exc).__name__}: {exc}"[:200])
            return (ItemState.UNCERTAIN, f"outcome unknown after {type(exc).__name__}: {exc}"[:200])
        if self._verdict is not None:
            return self._verdict
        return (ItemState.COMPLETED, "") if self.complete else None


class ExternalAction(_Verdict):
    def __enter__(self) -> ExternalAction:
        self.item = self.runtime.submit(self.item_id, idempotency_key=self.idempotency_key, worker=self.worker)
        return self

    def record(self, **fields: Any) -> RecordInfo:
        record: RecordInfo = self.runtime.attach_record(self.item_id, **fields)
        self.records.append(record)
        return record

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        decision = self._decide(exc)
        if decision is None:
            return
        state, detail = decision
        if state == ItemState.UNCERTAIN:
            self.item = self.runtime.mark_uncertain(self.item_id, detail=detail)
        else:
            self.item = self.runtime.finish(self.item_id, status=state, detail=detail)


class AsyncExternalAction(_Verdict):
    async def __aenter__(self) -> AsyncExternalAction:
        self.item = await self.runtime.submit(self.item_id, idempotency_key=self.idempotency_key, worker=self.worker)
        return self

    async def record(self, **fields: Any) -> RecordInfo:
        record: RecordInfo = await self.runtime.attach_record(self.item_id, **fields)
        self.records.append(record)
        return record

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        decision = self._decide(exc)
        if decision is None:
            return
        state, detail = decision
        if state == ItemState.UNCERTAIN:
            self.item = await self.runtime.mark_uncertain(self.item_id, detail=detail)
        else:
            self.item = await self.runtime.finish(self.item_id, status=state, detail=detail)
