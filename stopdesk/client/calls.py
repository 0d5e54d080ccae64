"""One description per call, shared by the sync and the async client: method, path, the body built
from the method's arguments, how to read the answer, and whether a retry is safe. The two clients
only differ in how they send a `Call` (`Client._run`, `AsyncClient._run`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stopdesk.protocol.spec import ItemSpec
from stopdesk.protocol.types import (
    HeartbeatInfo,
    ItemInfo,
    LaunchedInfo,
    RecordInfo,
    ResultInfo,
    ResultsInfo,
    StartedInfo,
    StopInfo,
    StopWatchInfo,
    TaskDetail,
    TaskInfo,
)


@dataclass(frozen=True)
class Call[T]:
    method: str
    path: str
    body: dict[str, Any] | None
    parse: Callable[[Any], T]
    # Safe to send again after an answer was lost: a read, an operation that is idempotent by
    # nature (stop, heartbeat), or a write carrying an Idempotency-Key the server replays.
    safe: bool
    key: str | None = None
    raise_on_stop: bool = False
    # Sent to the agent door (the watch server, once the client knows it: `watch_base`), which
    # serves the registration before each tool call and the calls' results on its event loop;
    # the web door before that.
    agent_door: bool = False


def _post[T](
    path: str,
    body: dict[str, Any],
    parse: Callable[[Any], T],
    key: str | None,
    *,
    keyed: bool = True,
    safe: bool = False,
) -> Call[T]:
    header = (key or uuid.uuid4().hex) if keyed else None
    return Call("POST", path, _compact(body), parse, safe=safe or header is not None, key=header)


def _compact(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def create_task(title: str, key: str | None) -> Call[TaskInfo]:
    return _post("/tasks", {"title": title}, TaskInfo.from_json, key)


def get_task(task_id: int) -> Call[TaskDetail]:
    return Call("GET", f"/tasks/{int(task_id)}", None, TaskDetail.from_json, safe=True)


def get_item(item_id: int) -> Call[ItemInfo]:
    return Call("GET", f"/items/{int(item_id)}", None, ItemInfo.from_json, safe=True)


def register(task_id: int, spec: ItemSpec, key: str | None) -> Call[ItemInfo]:
    return _post(f"/tasks/{int(task_id)}/items", spec.to_json(), ItemInfo.from_json, key)


def start(item_id: int, *, worker: str, lease_seconds: int | None) -> Call[ItemInfo]:
    body = {"worker": worker, "lease_seconds": lease_seconds}
    return _post(f"/items/{int(item_id)}/start", body, ItemInfo.from_json, None)


def submit(item_id: int, *, idempotency_key: str, worker: str, lease_seconds: int | None) -> Call[ItemInfo]:
    body = {"idempotency_key": idempotency_key, "worker": worker, "lease_seconds": lease_seconds}
    return _post(f"/items/{int(item_id)}/submit", body, ItemInfo.from_json, None)


def heartbeat(item_id: int, *, lease_seconds: int | None, raise_on_stop: bool) -> Call[HeartbeatInfo]:
    body = {"lease_seconds": lease_seconds}
    call = _post(f"/items/{int(item_id)}/heartbeat", body, HeartbeatInfo.from_json, None, keyed=False, safe=True)
    return Call(call.method, call.path, call.body, call.parse, safe=True, raise_on_stop=raise_on_stop)


def record_handle(item_id: int, *, handle: str, detail: dict[str, Any] | None, key: str | None) -> Call[ItemInfo]:
    return _post(f"/items/{int(item_id)}/handle", {"handle": handle, "detail": detail}, ItemInfo.from_json, key)


def attach_record(item_id: int, fields: dict[str, Any], key: str | None) -> Call[RecordInfo]:
    # `fields`: the keywords of the clients' attach_record, as they were given.
    return _post(f"/items/{int(item_id)}/records", fields, RecordInfo.from_json, key)


def finish(item_id: int, *, status: str, detail: str, evidence: dict[str, Any] | None) -> Call[ItemInfo]:
    body = {"status": status, "detail": detail, "evidence": evidence}
    return _post(f"/items/{int(item_id)}/finish", body, ItemInfo.from_json, None)


def mark_uncertain(item_id: int, *, detail: str, evidence: dict[str, Any] | None) -> Call[ItemInfo]:
    body = {"detail": detail, "evidence": evidence}
    return _post(f"/items/{int(item_id)}/uncertain", body, ItemInfo.from_json, None)


def cancel(item_id: int, *, detail: str) -> Call[ItemInfo]:
    return _post(f"/items/{int(item_id)}/cancel", {"detail": detail}, ItemInfo.from_json, None)


def note_evidence(item_id: int, *, message: str, evidence: dict[str, Any]) -> Call[ItemInfo]:
    body = {"message": message, "evidence": evidence}
    return _post(f"/items/{int(item_id)}/evidence", body, ItemInfo.from_json, None)


def request_stop(task_id: int, reason: str) -> Call[StopInfo]:
    # Stop is idempotent by nature: every repeat returns the same stop request.
    return _post(f"/tasks/{int(task_id)}/stop", {"reason": reason}, StopInfo.from_json, None, keyed=False, safe=True)


def close_task(task_id: int, reason: str) -> Call[TaskInfo]:
    # Closing is idempotent by nature: a repeat finds the task closed and changes nothing.
    return _post(f"/tasks/{int(task_id)}/close", {"reason": reason}, TaskInfo.from_json, None, keyed=False, safe=True)


# The calls a framework run makes most, each one request. Only register_started carries a key: the
# others are safe to repeat by nature (the same result, a report of the stop, a launched call
# recorded by its call id, a settle check, a read).


def register_started(
    task_id: int, spec: ItemSpec, *, submit_key: str, worker: str, lease_seconds: int | None, key: str | None
) -> Call[int]:
    body = {**spec.to_json(), "submit_key": submit_key, "worker": worker, "lease_seconds": lease_seconds}
    path = f"/tasks/{int(task_id)}/items/started"
    call = _post(path, body, lambda answer: int(StartedInfo.from_json(answer).id), key)
    return replace(call, agent_door=True)


def finish_fast(item_id: int, *, status: str, detail: str, open_item: int | None) -> Call[ResultInfo]:
    body = {"status": status, "detail": detail, "open_item": open_item}
    call = _post(f"/items/{int(item_id)}/result", body, ResultInfo.from_json, None, keyed=False, safe=True)
    return replace(call, agent_door=_door_writes(body))


def write_results(results: list[dict[str, Any]]) -> Call[ResultsInfo]:
    body = {"results": [_compact(result) for result in results]}
    call = _post("/results", body, ResultsInfo.from_json, None, keyed=False, safe=True)
    return replace(call, agent_door=all(_door_writes(result) for result in results))


def _door_writes(result: dict[str, Any]) -> bool:
    """Whether the watch server writes this result itself: a "completed" or "failed" result (a
    call's, or a run's own end, whose task it then checks for settled). A "stopped" report is
    Django's work, which the watch server would hand to threads beside the event loop that carries
    Stop to every watcher: a Stop of hundreds of tasks, each run reporting its end, then slowed
    the Stops still on their way. Those go to the web door."""
    return result.get("status") in ("completed", "failed")


def report_stopped(item_id: int, *, detail: str) -> Call[ItemInfo]:
    return _post(f"/items/{int(item_id)}/stopped", {"detail": detail}, ItemInfo.from_json, None, keyed=False, safe=True)


def record_launched(item_id: int, calls: list[dict[str, Any]]) -> Call[LaunchedInfo]:
    body = {"calls": [_compact(call) for call in calls]}
    return _post(f"/items/{int(item_id)}/launched", body, LaunchedInfo.from_json, None, keyed=False, safe=True)


def task_settle_check(task_id: int) -> Call[TaskInfo]:
    return _post(f"/tasks/{int(task_id)}/settle", {}, TaskInfo.from_json, None, keyed=False, safe=True)


def task_stopped(task_id: int) -> Call[StopWatchInfo]:
    # The stop watch with no wait: one indexed read, answered at once.
    return Call("GET", f"/tasks/{int(task_id)}/stop/watch?timeout=0", None, StopWatchInfo.from_json, safe=True)
