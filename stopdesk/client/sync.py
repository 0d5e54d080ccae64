"""The synchronous HTTP client."""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx

from stopdesk.client import calls
from stopdesk.client.calls import Call
from stopdesk.client.calls import record_launched as launched_call
from stopdesk.client.transport import WATCH_LIMITS, AgentDoor, api_base, backoff, headers_for, read_answer, should_retry
from stopdesk.client.watch import POLL_S, StopWatch, WatchPools
from stopdesk.protocol.action import ExternalAction
from stopdesk.protocol.spec import ItemSpec
from stopdesk.protocol.types import HeartbeatInfo, ItemInfo, RecordInfo, StopInfo, TaskDetail, TaskInfo


class Client:
    """Talks to stopdesk's runtime API with a bearer token. Method names and arguments match
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
        http: httpx.Client | None = None,
        watch_url: str | None = None,
        watch_http: httpx.Client | None = None,
    ) -> None:
        self.worker = worker
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self._own_http = http is None
        self.http = http or httpx.Client(timeout=timeout)
        self.base = api_base(base_url)
        # Where the stop watch is served. Unset, the web door's answer names the watch server (a
        # 307, followed and remembered), or the web door serves the watch itself.
        self.watch_base = api_base(watch_url) if watch_url else self.base
        self._door = AgentDoor()
        self.http.headers["Authorization"] = f"Bearer {token}"
        # Watches wait on connections of their own, never on the pool the boundary passes use.
        if watch_http is not None:
            watch_http.headers["Authorization"] = f"Bearer {token}"
        auth = {"Authorization": f"Bearer {token}"}
        self.watch_pools = WatchPools(
            lambda: httpx.Client(timeout=timeout, limits=WATCH_LIMITS, headers=auth), given=watch_http
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own_http:
            self.http.close()
        for pool in self.watch_pools.owned():
            pool.close()

    def _run[T](self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self.http.request(
                    call.method,
                    self._door.base(call, self.base, self.watch_base) + call.path,
                    json=call.body,
                    headers=headers_for(call),
                )
            except httpx.TransportError as exc:
                if self._door.unreachable(call, self.base, self.watch_base, exc):
                    continue
                if not should_retry(call, attempt, self.retries, error=exc):
                    raise
            else:
                if not should_retry(call, attempt, self.retries, status=response.status_code):
                    return read_answer(call, response)
            time.sleep(backoff(attempt, self.backoff_seconds))
            attempt += 1

    def _worker(self, worker: str | None) -> str:
        return self.worker if worker is None else worker

    # Tasks
    def create_task(self, title: str, *, request_key: str | None = None) -> TaskInfo:
        return self._run(calls.create_task(title, request_key))

    def get_task(self, task_id: int) -> TaskDetail:
        return self._run(calls.get_task(task_id))

    def request_stop(self, task_id: int, *, reason: str = "") -> StopInfo:
        return self._run(calls.request_stop(task_id, reason))

    def close_task(self, task_id: int, *, reason: str = "") -> TaskInfo:
        """Say the task is over: it takes no new work from now on (a registration is refused with
        TaskClosed). Until then a task whose items have all settled stays open and keeps its Stop.
        Idempotent."""
        return self._run(calls.close_task(task_id, reason))

    def watch_stop(self, task_id: int, *, poll_s: float = POLL_S) -> StopWatch:
        """A handle set (like a threading.Event) the moment the task's Stop commits. One daemon
        thread long-polls the server, which answers by push, not by polling the database."""
        return StopWatch(self, task_id, poll_s=poll_s)

    # Items
    def register(
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
        return self._run(calls.register(task_id, spec, request_key))

    def register_spec(self, task_id: int, spec: ItemSpec, *, request_key: str | None = None) -> ItemInfo:
        """`register`, with the item as one value (`stopdesk.client.ItemSpec`)."""
        return self._run(calls.register(task_id, spec, request_key))

    def get_item(self, item_id: int) -> ItemInfo:
        return self._run(calls.get_item(item_id))

    def start(self, item_id: int, *, worker: str | None = None, lease_seconds: int | None = None) -> ItemInfo:
        return self._run(calls.start(item_id, worker=self._worker(worker), lease_seconds=lease_seconds))

    def heartbeat(self, item_id: int, *, lease_seconds: int | None = None, raise_on_stop: bool = True) -> HeartbeatInfo:
        return self._run(calls.heartbeat(item_id, lease_seconds=lease_seconds, raise_on_stop=raise_on_stop))

    def submit(
        self, item_id: int, *, idempotency_key: str, worker: str | None = None, lease_seconds: int | None = None
    ) -> ItemInfo:
        call = calls.submit(
            item_id, idempotency_key=idempotency_key, worker=self._worker(worker), lease_seconds=lease_seconds
        )
        return self._run(call)

    def record_handle(
        self, item_id: int, *, handle: str, detail: dict[str, Any] | None = None, request_key: str | None = None
    ) -> ItemInfo:
        """Record the handle of work dispatched after registration, so Stop can cancel it."""
        return self._run(calls.record_handle(item_id, handle=handle, detail=detail, key=request_key))

    def attach_record(
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
        return self._run(calls.attach_record(item_id, fields, request_key))

    def finish(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> ItemInfo:
        return self._run(calls.finish(item_id, status=status, detail=detail, evidence=evidence))

    def mark_uncertain(self, item_id: int, *, detail: str = "", evidence: dict[str, Any] | None = None) -> ItemInfo:
        return self._run(calls.mark_uncertain(item_id, detail=detail, evidence=evidence))

    def cancel(self, item_id: int, *, detail: str = "") -> ItemInfo:
        return self._run(calls.cancel(item_id, detail=detail))

    def note_evidence(self, item_id: int, *, message: str, evidence: dict[str, Any]) -> ItemInfo:
        """An observation on the item, its state unchanged."""
        return self._run(calls.note_evidence(item_id, message=message, evidence=evidence))

    # The calls a framework run makes most (stopdesk.agent.frameworks.core), each one request, with
    # the in-process LocalRuntime's names and arguments.
    def register_started(
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
        return self._run(call)

    def finish_fast(
        self,
        item_id: int,
        *,
        status: Literal["completed", "failed"] | str = "completed",
        detail: str = "",
        open_item: int | None = None,
    ) -> None:
        """`finish` without reading the item back; `open_item` is the caller's own open item (its
        run), which keeps the task from settling meanwhile."""
        self._run(calls.finish_fast(item_id, status=status, detail=detail, open_item=open_item))

    def write_results(self, results: list[dict[str, Any]]) -> None:
        """Several items' results in one request (each `finish_fast`'s keywords and its `item`);
        one refused refuses them all, and nothing is written."""
        self._run(calls.write_results(results))

    def report_stopped(self, item_id: int, *, detail: str = "") -> ItemInfo:
        """The work stopped because of Stop: cancelled, also when Stop's job already left it
        awaiting this report."""
        return self._run(calls.report_stopped(item_id, detail=detail))

    def record_launched(self, item_id: int, calls: list[dict[str, Any]]) -> list[int]:
        """Tool calls a model response ran itself, as children of its item, each call id once;
        returns the ids of the items created now."""
        return (self._run(launched_call(item_id, calls))).created

    def task_settle_check(self, task_id: int) -> TaskInfo:
        return self._run(calls.task_settle_check(task_id))

    def task_stopped(self, task_id: int) -> bool:
        return (self._run(calls.task_stopped(task_id))).stopped

    def external_action(
        self,
        item_id: int,
        *,
        idempotency_key: str,
        worker: str | None = None,
        failures: tuple[type[BaseException], ...] = (),
        complete: bool = True,
    ) -> ExternalAction:
        return ExternalAction(
            self, item_id, idempotency_key=idempotency_key, worker=worker, failures=failures, complete=complete
        )
