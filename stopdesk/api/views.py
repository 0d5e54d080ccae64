"""The endpoints. Each one: authenticate, validate, call one LocalRuntime method inside one
transaction, answer JSON. Every refusal has the same shape and writes nothing; the one exception is
the boundary's refusal (409 task_stopped), whose cancellation of the item *is* the record and is
committed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.db import IntegrityError, OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from stopdesk.agent import schemas
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.agent.runtime.errors import ledger_errors
from stopdesk.agent.runtime.info import task_info
from stopdesk.api.auth import authenticate
from stopdesk.api.errors import error_response, server_error
from stopdesk.api.idempotency import once, once_transition, once_work_first
from stopdesk.api.reading import MAX_BODY_BYTES, json_body, request_key, too_large
from stopdesk.models import WorkItem
from stopdesk.protocol.errors import (
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
    StopdeskError,
    StopRequested,
)
from stopdesk.protocol.ids import path_id
from stopdesk.protocol.types import ItemInfo, LaunchedInfo, RecordInfo, ResultInfo, ResultsInfo, StartedInfo, TaskInfo
from stopdesk.tracing import server_span, span_event

log = logging.getLogger(__name__)

API_ROUTE = "/api/v1"


@dataclass(frozen=True)
class Operation:
    """What the OpenAPI document says about an endpoint; the view is built from the same facts."""

    name: str
    method: str
    path: str  # OpenAPI template, e.g. /items/{item_id}/start
    summary: str
    body: type[schemas.Body] | None
    returns: str
    status: int
    errors: tuple[int, ...]
    replayable: bool
    view: Callable[..., HttpResponse]


OPERATIONS: list[Operation] = []
# deadlock_detected, serialization_failure: the transaction was rolled back whole; run it again.
VICTIM_SQLSTATES = frozenset({"40P01", "40001"})
VICTIM_RETRIES = 3


def endpoint(
    method: str,
    path: str,
    *,
    body: type[schemas.Body] | None = None,
    returns: str,
    status: int = 200,
    conflicts: bool = False,
    names_items: bool = False,
    replayable: bool = True,
    atomic: bool = True,
) -> Callable[..., Any]:
    def register(fn: Callable[..., Any]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(fn)
        def view(request: HttpRequest, **path_ids: str) -> HttpResponse:
            route = API_ROUTE + path
            attributes = {"http.request.method": request.method, "http.route": route, "url.path": request.path}
            with server_span(request.headers, f"{method} {route}", attributes) as span:
                try:
                    response = _serve(
                        request, fn, method, body, replayable and method == "POST", path_ids, status, atomic
                    )
                except StopdeskError as exc:
                    response = error_response(exc)
                except Exception:
                    log.exception("runtime API %s %s failed", request.method, request.path)
                    response = server_error()
                span.set_attribute("http.response.status_code", response.status_code)
                return response

        errors = [401]
        if method == "POST":
            errors += [400, 413, 422]
        if "{" in path or names_items:  # a path or a body naming what may not be there
            errors.append(404)
        if conflicts:
            errors.append(409)
        OPERATIONS.append(
            Operation(
                fn.__name__,
                method,
                path,
                (fn.__doc__ or "").strip(),
                body,
                returns,
                status,
                tuple(sorted(errors)),
                replayable and method == "POST",
                view,
            )
        )
        return view

    return register


def _serve(
    request: HttpRequest,
    fn: Callable[..., Any],
    method: str,
    body: type[schemas.Body] | None,
    replayable: bool,
    path_ids: dict[str, str],
    status: int,
    atomic: bool,
) -> HttpResponse:
    if request.method != method:
        raise MethodNotAllowed(f"Use {method} here.", allow=[method])
    runtime = authenticate(request)
    ids = {name: path_id(value, name) for name, value in path_ids.items()}
    key = _request_key(request) if replayable else None
    args = body.parse(_read_json(request)) if body is not None else None
    sd = LocalRuntime(runtime=runtime)
    if not atomic:
        return JsonResponse(fn(sd, args, key, **ids).to_json(), status=status)
    conflicts = 0
    for attempt in range(1, VICTIM_RETRIES + 2):
        refused: StopRequested | None = None
        try:
            with transaction.atomic():
                try:
                    result = fn(sd, args, key, **ids)
                except StopRequested as exc:
                    # Committed on purpose: the boundary cancelled the item, and that is the record.
                    refused = exc
            break
        except IntegrityError:
            # A concurrent request won a unique key (Idempotency-Key, external record). Everything
            # was rolled back; once more sees its committed result.
            conflicts += 1
            if conflicts == 2:
                raise
        except OperationalError as exc:
            # PostgreSQL chose this request's transaction as a deadlock (or serialization) victim
            # and rolled it back whole, its after-commit work included: nothing happened, so it is
            # run again rather than answered 500 (a runtime's report lost to a lock race).
            if getattr(exc.__cause__, "sqlstate", None) not in VICTIM_SQLSTATES or attempt > VICTIM_RETRIES:
                raise
            log.warning("runtime API %s %s: %s; running it again", request.method, request.path, exc)
    if refused is not None:
        facts = {f"stopdesk.{k}.id": v for k, v in refused.extra.items() if k in ("task", "item")}
        span_event("stopdesk.boundary_refused", facts)
        raise refused
    return JsonResponse(result.to_json(), status=status)


def _request_key(request: HttpRequest) -> str | None:
    return request_key(request.headers.get("Idempotency-Key"))


def _read_json(request: HttpRequest) -> dict[str, Any]:
    if too_large(request.META.get("CONTENT_LENGTH")):
        raise PayloadTooLarge(f"The body is larger than {MAX_BODY_BYTES} bytes.")
    return json_body(request.body)


# Endpoints: (runtime, validated body, Idempotency-Key, path ids) -> an answer from stopdesk.protocol.types.


@endpoint("POST", "/tasks", body=schemas.CreateTask, returns="TaskInfo", status=201)
def create_task(sd: LocalRuntime, args: schemas.CreateTask, key: str | None) -> Any:
    """Create a task owned by this runtime."""
    return once(sd.runtime, key, "create_task", TaskInfo, lambda: sd.create_task(args.title), args)


@endpoint("GET", "/tasks/{task_id}", returns="TaskDetail")
def get_task(sd: LocalRuntime, args: None, key: None, task_id: int) -> Any:
    """A task with its counts by state, its items (the first 1,000) and its summary sentence."""
    return sd.get_task(task_id)


@endpoint("POST", "/tasks/{task_id}/items", body=schemas.RegisterItem, returns="ItemInfo", status=201, conflicts=True)
def register(sd: LocalRuntime, args: schemas.RegisterItem, key: str | None, task_id: int) -> Any:
    """Register a work item before dispatching it. Allowed after Stop, but such an item can never start. A closed
    task takes no new work: 409 task_closed, and nothing is written."""
    return once(sd.runtime, key, f"register:{task_id}", ItemInfo, lambda: sd.register_spec(task_id, args.spec()), args)


# Stop keeps its own transactions: the request commits first (so it is durable at once), then the
# fan-out; see stopdesk.services.stop.
@endpoint("POST", "/tasks/{task_id}/stop", body=schemas.RequestStop, returns="StopInfo", replayable=False, atomic=False)
def request_stop(sd: LocalRuntime, args: schemas.RequestStop, key: None, task_id: int) -> Any:
    """Request Stop. Idempotent: every call returns the task's one stop request (`created` only the first time)."""
    return sd.request_stop(task_id, reason=args.reason)  # traced as `stopdesk.stop` by the service


@endpoint("POST", "/tasks/{task_id}/close", body=schemas.CloseTask, returns="TaskInfo", replayable=False)
def close_task(sd: LocalRuntime, args: schemas.CloseTask, key: None, task_id: int) -> Any:
    """Say the task is over: from now on it takes no new work (registering is 409 task_closed, writing nothing).
    Until then a task whose items have all settled stays open and keeps its Stop; an open task idle for
    STOPDESK_TASK_IDLE_CLOSE_MINUTES is closed by the server. Idempotent."""
    return sd.close_task(task_id, reason=args.reason)


@endpoint("GET", "/items/{item_id}", returns="ItemInfo")
def get_item(sd: LocalRuntime, args: None, key: None, item_id: int) -> Any:
    """One work item."""
    return sd.get_item(item_id)


@endpoint("POST", "/items/{item_id}/start", body=schemas.Start, returns="ItemInfo", conflicts=True)
def start(sd: LocalRuntime, args: schemas.Start, key: str | None, item_id: int) -> Any:
    """The boundary before starting queued work: 409 task_stopped once Stop was requested (the item is then
    cancelled); 409 illegal_transition naming the state if the item is not queued."""
    return once_transition(
        sd.runtime,
        key,
        f"start:{item_id}",
        ItemInfo,
        lambda: sd.start(item_id, worker=args.worker, lease_seconds=args.lease_seconds),
        args,
    )


@endpoint(
    "POST",
    "/items/{item_id}/heartbeat",
    body=schemas.Heartbeat,
    returns="HeartbeatInfo",
    conflicts=True,
    replayable=False,
)
def heartbeat(sd: LocalRuntime, args: schemas.Heartbeat, key: None, item_id: int) -> Any:
    """Extend a running item's lease; `stop_requested` says whether to stop between steps."""
    return sd.heartbeat(item_id, lease_seconds=args.lease_seconds, raise_on_stop=False)


@endpoint("POST", "/items/{item_id}/submit", body=schemas.Submit, returns="ItemInfo", conflicts=True)
def submit(sd: LocalRuntime, args: schemas.Submit, key: str | None, item_id: int) -> Any:
    """The boundary before an external action, recording its idempotency key before the call goes out
    (from queued, or from running before the item's first submission)."""
    return once_transition(
        sd.runtime,
        key,
        f"submit:{item_id}",
        ItemInfo,
        lambda: sd.submit(
            item_id, idempotency_key=args.idempotency_key, worker=args.worker, lease_seconds=args.lease_seconds
        ),
        args,
    )


@endpoint("POST", "/items/{item_id}/handle", body=schemas.RecordHandle, returns="ItemInfo", conflicts=True)
def record_handle(sd: LocalRuntime, args: schemas.RecordHandle, key: str | None, item_id: int) -> Any:
    """Record the handle of work dispatched after registration (a response id, an MCP task id, an operation URL)
    so Stop can cancel it through its mechanism. Only for an item that passed the boundary (409 illegal_transition
    otherwise); one handle per item (409 handle_conflict for another; the same one again is a no-op). After Stop
    it is still recorded, and an item whose cancel was requested is checked again at once."""
    return once(
        sd.runtime,
        key,
        f"record_handle:{item_id}",
        ItemInfo,
        lambda: sd.record_handle(item_id, handle=args.handle, detail=args.detail),
        args,
    )


@endpoint(
    "POST", "/items/{item_id}/records", body=schemas.AttachRecord, returns="RecordInfo", status=201, conflicts=True
)
def attach_record(sd: LocalRuntime, args: schemas.AttachRecord, key: str | None, item_id: int) -> Any:
    """Attach an external record (system, record id, version, effect, reversibility, link) to an item that
    passed the boundary. Attaching the same record again updates its version."""
    return once(
        sd.runtime,
        key,
        f"attach_record:{item_id}",
        RecordInfo,
        lambda: sd.attach_record(item_id, **args.model_dump()),
        args,
    )


@endpoint("POST", "/items/{item_id}/finish", body=schemas.Finish, returns="ItemInfo", conflicts=True)
def finish(sd: LocalRuntime, args: schemas.Finish, key: str | None, item_id: int) -> Any:
    """Report completed or failed. A result for an item Stop already settled is kept as a late result (an event,
    and the item flagged for review), never written over the recorded outcome."""
    return once(
        sd.runtime,
        key,
        f"finish:{item_id}",
        ItemInfo,
        lambda: sd.finish(item_id, status=args.status, detail=args.detail, evidence=args.evidence),
        args,
    )


@endpoint("POST", "/items/{item_id}/uncertain", body=schemas.MarkUncertain, returns="ItemInfo", conflicts=True)
def mark_uncertain(sd: LocalRuntime, args: schemas.MarkUncertain, key: str | None, item_id: int) -> Any:
    """The external call's outcome is unknown: uncertain, with an investigate-by deadline and a review."""
    return once(
        sd.runtime,
        key,
        f"mark_uncertain:{item_id}",
        ItemInfo,
        lambda: sd.mark_uncertain(item_id, detail=args.detail, evidence=args.evidence),
        args,
    )


@endpoint("POST", "/items/{item_id}/cancel", body=schemas.Cancel, returns="ItemInfo", conflicts=True)
def cancel(sd: LocalRuntime, args: schemas.Cancel, key: str | None, item_id: int) -> Any:
    """The worker stopped between steps (after a heartbeat said Stop), or a queued item will not be dispatched."""
    return once(sd.runtime, key, f"cancel:{item_id}", ItemInfo, lambda: sd.cancel(item_id, detail=args.detail), args)


@endpoint("POST", "/items/{item_id}/evidence", body=schemas.NoteEvidence, returns="ItemInfo")
def note_evidence(sd: LocalRuntime, args: schemas.NoteEvidence, key: str | None, item_id: int) -> Any:
    """Add an observation to an item without changing its state (a tool body that Stop cannot interrupt, still
    running), with an event saying what was seen."""
    return once(
        sd.runtime,
        key,
        f"note_evidence:{item_id}",
        ItemInfo,
        lambda: sd.note_evidence(item_id, message=args.message, evidence=args.evidence),
        args,
    )


# The calls a framework run makes most, each one request (see stopdesk.agent.runtime.local).


@endpoint(
    "POST",
    "/tasks/{task_id}/items/started",
    body=schemas.RegisterStarted,
    returns="StartedInfo",
    status=201,
    conflicts=True,
)
def register_started(sd: LocalRuntime, args: schemas.RegisterStarted, key: str | None, task_id: int) -> Any:
    """Register a work item and pass the boundary in one request: started, or submitted with `submit_key` (an
    external action). For work that starts the moment it is known (a framework's tool call or model request).
    After Stop: 409 task_stopped naming the item, which is recorded, cancelled. On a closed task: 409 task_closed,
    and nothing is written."""
    fields = args.model_dump()
    if args.parent is not None and not WorkItem.objects.filter(pk=args.parent, task_id=sd._task(task_id).pk).exists():
        raise InvalidRequest("parent must be an item of the same task.", field="parent")

    def produce() -> StartedInfo:
        with ledger_errors():
            return StartedInfo(id=sd.register_started(task_id, **fields), task=task_id)

    return once_work_first(sd.runtime, key, f"register_started:{task_id}", StartedInfo, produce, args)


@endpoint(
    "POST", "/items/{item_id}/result", body=schemas.FinishFast, returns="ResultInfo", conflicts=True, replayable=False
)
def finish_fast(sd: LocalRuntime, args: schemas.FinishFast, key: None, item_id: int) -> Any:
    """Report completed or failed without reading the item back: a running item's result in one statement; any
    other case as `finish` (a result for an item Stop settled is a late result). Safe to repeat: the same result
    again changes nothing."""
    sd.finish_fast(item_id, status=args.status, detail=args.detail, open_item=args.open_item)
    return ResultInfo(item=item_id, status=args.status)


@endpoint(
    "POST",
    "/results",
    body=schemas.WriteResults,
    returns="ResultsInfo",
    conflicts=True,
    names_items=True,
    replayable=False,
)
def write_results(sd: LocalRuntime, args: schemas.WriteResults, key: None) -> Any:
    """Several items' results in one request and one transaction, each written as `POST /items/{item_id}/result`
    writes it, or with status "stopped" as `POST /items/{item_id}/stopped` does (`results[].item` names the item).
    One refused (an item unknown here) refuses them all, and nothing is written. Safe to repeat: the same results
    again change nothing."""
    sd.write_results([result.model_dump() for result in args.results])
    return ResultsInfo(items=[result.item for result in args.results])


@endpoint("POST", "/items/{item_id}/stopped", body=schemas.ReportStopped, returns="ItemInfo", replayable=False)
def report_stopped(sd: LocalRuntime, args: schemas.ReportStopped, key: None, item_id: int) -> Any:
    """The work stopped because of Stop: cancelled, also when Stop's job already left it awaiting this report (a
    "manual" item) or uncertain; an item recorded otherwise keeps its outcome and this becomes a late result. Safe
    to repeat."""
    sd.report_stopped(item_id, detail=args.detail)
    return sd.get_item(item_id)


@endpoint("POST", "/items/{item_id}/launched", body=schemas.RecordLaunched, returns="LaunchedInfo", replayable=False)
def record_launched(sd: LocalRuntime, args: schemas.RecordLaunched, key: None, item_id: int) -> Any:
    """Tool calls a model response ran itself (hosted MCP calls, code interpreter, searches), recorded as children
    of the response's item, each call id once: started when the response was, then completed or failed as the
    provider reports, settled if read-only, otherwise uncertain with an investigate-by deadline. A completed call
    not known read-only is an effect: its arguments kept, an external record, flagged for review. Safe to repeat: a
    call already recorded is not recorded again (`created` lists only the new items); a later report that it ended
    moves its record (a late result, flagged, where it contradicts a settled one)."""
    calls = [call.model_dump() for call in args.calls]
    return LaunchedInfo(item=item_id, created=sd.record_launched(item_id, calls))


@endpoint("POST", "/tasks/{task_id}/settle", body=schemas.SettleCheck, returns="TaskInfo", replayable=False)
def task_settle_check(sd: LocalRuntime, args: schemas.SettleCheck, key: None, task_id: int) -> Any:
    """Settle the task now if every item has settled (for results sent with `open_item` that may have committed
    after the run's item settled). Safe to repeat."""
    sd.task_settle_check(task_id)
    return task_info(sd._task(task_id))
