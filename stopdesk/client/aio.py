"""The asynchronous HTTP client: the same methods as Client, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import httpx

from stopdesk.client import calls
from stopdesk.client.aio_calls import CallSession
from stopdesk.client.calls import Call
from stopdesk.client.calls import record_launched as launched_call
from stopdesk.client.together import ResultsTogether
from stopdesk.client.transport import (
    CALLS_IN_FLIGHT,
    WATCH_LIMITS,
    AgentDoor,
    api_base,
    backoff,
    headers_for,
    read_answer,
    should_retry,
)
from stopdesk.client.watch import POLL_S, AsyncWatches, WatchPools
from stopdesk.protocol.action import AsyncExternalAction
from stopdesk.protocol.spec import ItemSpec
from stopdesk.protocol.types import (
    HeartbeatInfo,
    ItemInfo,
    RecordInfo,
    StopInfo,
    StopWatchInfo,
    TaskDetail,
    TaskInfo,
)


class AsyncClient:
    """Talks to stopdesk's runtime API with a bearer token, from asyncio. Method names and arguments match
    `stopdesk.agent.runtime.LocalRuntime`, so agent code can switch between the two.

    Every write carries an Idempotency-Key (generated unless you pass `request_key`), so a retry
    after a lost answer gets the first answer back instead of doing the work twice.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        worker: str = "",
        timeout: float = 10.0,
        retries: int = 3,
        backoff_seconds: float = 0.2,
        http: httpx.AsyncClient | None = None,
        watch_url: str | None = None,
        watch_http: httpx.AsyncClient | None = None,
    ) -> None:
        self.worker = worker
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        # The calls go through aiohttp (`aio_calls`: a fraction of httpx's CPU a call, taken from
        # the agent's own steps otherwise), or through the httpx client you give (`http`).
        self.http = http
        if http is not None:
            http.headers["Authorization"] = f"Bearer {token}"
        self._calls = CallSession(timeout=timeout, limit=CALLS_IN_FLIGHT, headers={"Authorization": f"Bearer {token}"})
        # Calls beyond this wait here, where a waiter costs nothing, not in the pool's queue (see
        # CALLS_IN_FLIGHT); a pool of your own (`http`) gets the same bound.
        self._in_flight = asyncio.Semaphore(CALLS_IN_FLIGHT)
        self.base = api_base(base_url)
        # Where the stop watch is served. Unset, the web door's answer names the watch server (a
        # 307, followed and remembered), or the web door serves the watch itself.
        self.watch_base = api_base(watch_url) if watch_url else self.base
        self._door = AgentDoor()
        # Watches wait on connections of their own, never on the pool the boundary passes use.
        if watch_http is not None:
            watch_http.headers["Authorization"] = f"Bearer {token}"
        auth = {"Authorization": f"Bearer {token}"}
        self.watch_pools = WatchPools(
            lambda: httpx.AsyncClient(timeout=timeout, limits=WATCH_LIMITS, headers=auth), given=watch_http
        )
        self._watches = AsyncWatches(self)  # every watch_stop of this client on one long poll
        self._results = ResultsTogether(lambda rows: self._run(calls.write_results(rows)))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._calls.aclose()
        for pool in self.watch_pools.owned():
            await pool.aclose()

    async def _run[T](self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                async with self._in_flight:
                    response = await self._send(call)
            except httpx.TransportError as exc:
                if self._door.unreachable(call, self.base, self.watch_base, exc):
                    continue
                if not should_retry(call, attempt, self.retries, error=exc):
                    raise
            else:
                if not should_retry(call, attempt, self.retries, status=response.status_code):
                    return read_answer(call, response)
            await asyncio.sleep(backoff(attempt, self.backoff_seconds))
            attempt += 1

    async def _send(self, call: Call[Any]) -> Any:
        url, headers = self._door.base(call, self.base, self.watch_base) + call.path, headers_for(call)
        if self.http is not None:
            return await self.http.request(call.method, url, json=call.body, headers=headers)
        return await self._calls.request(call.method, url, json_body=call.body, headers=headers)

    def _worker(self, worker: str | None) -> str:
        return self.worker if worker is None else worker

    # Tasks
    async def create_task(self, title: str, *, request_key: str | None = None) -> TaskInfo:
        return await self._run(calls.create_task(title, request_key))

    async def get_task(self, task_id: int) -> TaskDetail:
        return await self._run(calls.get_task(task_id))

    async def request_stop(self, task_id: int, *, reason: str = "") -> StopInfo:
        return await self._run(calls.request_stop(task_id, reason))

    async def close_task(self, task_id: int, *, reason: str = "") -> TaskInfo:
        """Say the task is over: it takes no new work from now on (a registration is refused with
        TaskClosed). Until then a task whose items have all settled stays open and keeps its Stop.
        Idempotent."""
        return await self._run(calls.close_task(task_id, reason))

    async def watch_stop(
        self, task_id: int, *, poll_s: float = POLL_S, on_stop: Callable[[StopWatchInfo], object] | None = None
    ) -> StopWatchInfo:
        """Return the moment the task's Stop commits (pushed by the server; the client's watches
        share one request for all their tasks where the server offers it). `on_stop(info)`, if
        given, is called once before this returns, on the loop, as soon as the answer is read: a
        run's cancel started there does not wait for this call's own turn on the loop."""
        return await self._watches.watch(task_id, poll_s, on_stop)

    # Items
    async def register(
        self,
        task_id: int,
        *,
        kind: str,
        noun: str,
        noun_plural: str = "",
        mechanism: str = "manual",
        handle: str = "",
        label: str = "",
        parent: int | None = None,
        idempotency_key: str = "",
        detail: dict[str, Any] | None = None,
        request_key: str | None = None,
    ) -> ItemInfo:
        spec = ItemSpec(
            kind=kind,
            noun=noun,
            noun_plural=noun_plural,
            mechanism=mechanism,
            handle=handle,
            label=label,
            parent=parent,
            idempotency_key=idempotency_key,
            detail=detail,
        )
        return await self._run(calls.register(task_id, spec, request_key))

    async def register_spec(self, task_id: int, spec: ItemSpec, *, request_key: str | None = None) -> ItemInfo:
        """`register`, with the item as one value (`stopdesk.client.ItemSpec`)."""
        return await self._run(calls.register(task_id, spec, request_key))

    async def get_item(self, item_id: int) -> ItemInfo:
        return await self._run(calls.get_item(item_id))

    async def start(self, item_id: int, *, worker: str | None = None, lease_seconds: int | None = None) -> ItemInfo:
        return await self._run(calls.start(item_id, worker=self._worker(worker), lease_seconds=lease_seconds))

    async def heartbeat(
        self, item_id: int, *, lease_seconds: int | None = None, raise_on_stop: bool = True
    ) -> HeartbeatInfo:
        return await self._run(calls.heartbeat(item_id, lease_seconds=lease_seconds, raise_on_stop=raise_on_stop))

    async def submit(
        self, item_id: int, *, idempotency_key: str, worker: str | None = None, lease_seconds: int | None = None
    ) -> ItemInfo:
        call = calls.submit(
            item_id, idempotency_key=idempotency_key, worker=self._worker(worker), lease_seconds=lease_seconds
        )
        return await self._run(call)

    async def record_handle(
        self, item_id: int, *, handle: str, detail: dict[str, Any] | None = None, request_key: str | None = None
    ) -> ItemInfo:
        """Record the handle of work dispatched after registration, so Stop can cancel it."""
        return await self._run(calls.record_handle(item_id, handle=handle, detail=detail, key=request_key))

    async def attach_record(
        self,
        item_id: int,
        *,
        system: str,
        record_id: str,
        effect: str,
        version: str = "",
        reversible: bool = False,
        reversal: str = "",
        link: str = "",
        request_key: str | None = None,
    ) -> RecordInfo:
        fields = {
            "system": system,
            "record_id": record_id,
            "effect": effect,
            "version": version,
            "reversible": reversible,
            "reversal": reversal,
            "link": link,
        }
        return await self._run(calls.attach_record(item_id, fields, request_key))

    async def finish(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> ItemInfo:
        return await self._run(calls.finish(item_id, status=status, detail=detail, evidence=evidence))

    async def mark_uncertain(
        self, item_id: int, *, detail: str = "", evidence: dict[str, Any] | None = None
    ) -> ItemInfo:
        return await self._run(calls.mark_uncertain(item_id, detail=detail, evidence=evidence))

    async def cancel(self, item_id: int, *, detail: str = "") -> ItemInfo:
        return await self._run(calls.cancel(item_id, detail=detail))

    async def note_evidence(self, item_id: int, *, message: str, evidence: dict[str, Any]) -> ItemInfo:
        """An observation on the item, its state unchanged."""
        return await self._run(calls.note_evidence(item_id, message=message, evidence=evidence))

    # The calls a framework run makes most (stopdesk.agent.frameworks.core), each one request, with
    # the in-process LocalRuntime's names and arguments.
    async def register_started(
        self,
        task_id: int,
        *,
        kind: str,
        noun: str,
        submit_key: str = "",
        worker: str | None = None,
        lease_seconds: int | None = None,
        noun_plural: str = "",
        mechanism: str = "manual",
        handle: str = "",
        label: str = "",
        parent: int | None = None,
        idempotency_key: str = "",
        detail: dict[str, Any] | None = None,
        request_key: str | None = None,
    ) -> int:
        """Register a work item and pass the boundary (start, or submit with `submit_key`); returns
        its id. Raises StopRequested after Stop (the item is recorded, cancelled)."""
        spec = ItemSpec(
            kind=kind,
            noun=noun,
            noun_plural=noun_plural,
            mechanism=mechanism,
            handle=handle,
            label=label,
            parent=parent,
            idempotency_key=idempotency_key,
            detail=detail,
        )
        call = calls.register_started(
            task_id,
            spec,
            submit_key=submit_key,
            worker=self._worker(worker),
            lease_seconds=lease_seconds,
            key=request_key,
        )
        return await self._run(call)

    async def finish_fast(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        open_item: int | None = None,
    ) -> None:
        """`finish` without reading the item back; `open_item` is the caller's own open item (its
        run), which keeps the task from settling meanwhile."""
        await self._run(calls.finish_fast(item_id, status=status, detail=detail, open_item=open_item))

    async def write_results(self, results: list[dict[str, Any]]) -> None:
        """Several items' results in one request (each `finish_fast`'s keywords and its `item`, or
        `{"item", "status": "stopped", "detail"}` as `report_stopped` takes it); one refused
        refuses them all, and nothing is written. Calls made while another is on its way go
        together in the next request (`together.py`); each caller's answer is still its own."""
        await self._results.write(results)

    async def report_stopped(self, item_id: int, *, detail: str = "") -> ItemInfo:
        """The work stopped because of Stop: cancelled, also when Stop's job already left it
        awaiting this report."""
        return await self._run(calls.report_stopped(item_id, detail=detail))

    async def record_launched(self, item_id: int, calls: list[dict[str, Any]]) -> list[int]:
        """Tool calls a model response ran itself, as children of its item, each call id once;
        returns the ids of the items created now."""
        return (await self._run(launched_call(item_id, calls))).created

    async def task_settle_check(self, task_id: int) -> TaskInfo:
        return await self._run(calls.task_settle_check(task_id))

    async def task_stopped(self, task_id: int) -> bool:
        return (await self._run(calls.task_stopped(task_id))).stopped

    def external_action(
        self,
        item_id: int,
        *,
        idempotency_key: str,
        worker: str | None = None,
        failures: tuple[type[BaseException], ...] = (),
        complete: bool = True,
    ) -> AsyncExternalAction:
        return AsyncExternalAction(
            self, item_id, idempotency_key=idempotency_key, worker=worker, failures=failures, complete=complete
        )
