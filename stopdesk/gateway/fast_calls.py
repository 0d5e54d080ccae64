"""A 2026-07-28 `tools/call` from a client to an upstream that speaks 2026-07-28 over Streamable
HTTP, forwarded as JSON, without the SDK's server and client on the call's path.

Both revisions' calls can go through the SDK (`server.py`): its server parses and validates the
request into models, runs the handler, and its client, on the upstream side, does the same again
with the answer. Here, the two sides cost about 6 ms a call; a stateless call forwarded as it came
costs a few tenths of one. So a call that needs nothing else goes this way:
- the request passed the SDK's own checks for a 2026-07-28 request (its transport security, the
  Accept header, the routing headers against the body and `_meta`, and the `Mcp-Param-*` headers
  against the tool's schema as last listed): `mcp.shared.inbound`'s public functions;
- it is one `tools/call` that asks for no task, of a tool the gateway has listed, for an upstream
  the gateway reached in 2026-07-28 over HTTP.
Anything else (a 2025-11-25 session, a task, `tools/list`, a stdio upstream, a request any check
refuses) goes to the SDK's app as it came, so every refusal is the SDK's own.

The call keeps every rule of `UpstreamGateway._call`: readiness, the retry gate and the
registration with its boundary before anything is sent (`UpstreamGateway.enter`), the task's Stop
watched and confirmed by the item's heartbeat every `poll_s` (its lease), Stop's cancel the way
the revision means it (the upstream's response stream closed), the client's own cancel (its stream
closed, which cancels the upstream call), and the answer recorded with the upstream's id of the
call: before the client hears it, unless no identical call's retry gate could read the call while
it runs (a read, or an idempotent tool's call: `retry_gate.answer_may_follow_reply`); then just
after, so the client does not wait for the commit."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from mcp.client.session import DEFAULT_CLIENT_INFO
from mcp.server.runner import modern_error_data
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, INTERNAL_ERROR, PROTOCOL_VERSION_META_KEY
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reconcile.mechanisms.mcp.agent import ProgressSeen
from reconcile.mechanisms.mcp.agent.calls import record_cancelled
from reconcile.mechanisms.mcp.agent.common import record_failure
from reconcile.mechanisms.mcp.servers import MODERN
from stopdesk.agent.aio import in_thread, ledger_threads
from stopdesk.gateway.ledger_pool import LedgerPool
from stopdesk.gateway.retry_gate import answer_may_follow_reply
from stopdesk.gateway.server import (
    Answer,
    Entered,
    UpstreamGateway,
    UpstreamId,
    caller_from,
    client_cancelled,
    outcome_text,
    stopped_error,
)
from stopdesk.gateway.sessions import ACTOR, Caller
from stopdesk.gateway.tasks import declares_tasks
from stopdesk.services.items import item_heartbeat

log = logging.getLogger(__name__)
# What the gateway calls itself upstream: the SDK client's own default, as on the SDK path.
UPSTREAM_CLIENT_INFO = DEFAULT_CLIENT_INFO.model_dump(mode="json", exclude_none=True)
MCP_PARAM_HEADER_PREFIX = "mcp-param-"
JSON_HEADERS = [(b"content-type", b"application/json")]


class FastCalls:
    """The ASGI endpoint at `/mcp/<name>`: a call this path can take, else the SDK's app."""

    def __init__(
        self,
        gateway: UpstreamGateway,
        sdk_app: ASGIApp,
        security: TransportSecuritySettings | None,
        pool: LedgerPool,
    ) -> None:
        self.gateway = gateway
        self.pool = pool
        self.sdk_app = sdk_app
        self.security = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _may_be_a_modern_call(scope):
            await self.sdk_app(scope, receive, send)
            return
        body, receive = await _body_of(receive)
        with ledger_threads(self.gateway.ledger):
            call = None if body is None else await self._call_of(Request(scope, receive), body)
            if call is not None:
                self.gateway.calls["forwarded"] += 1
                await _Forwarded(self.gateway, self.pool, call, receive, send).run()
                return
        await self.sdk_app(scope, receive, send)

    async def _call_of(self, request: Request, body: bytes) -> _Call | None:
        """The call, if this path can take it; None sends the request to the SDK's app."""
        if await self.security.validate_request(request, is_post=True) is not None:
            return None
        if not check_accept_headers(request)[0]:
            return None
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call":
            return None
        request_id, params = message.get("id"), message.get("params")
        if isinstance(request_id, bool) or not isinstance(request_id, int | str) or not isinstance(params, dict):
            return None
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not isinstance(arguments, dict) or "task" in params:
            return None
        if find_duplicated_routing_header(request.headers.items()) is not None:
            return None
        headers = dict(request.headers)
        verdict = classify_inbound_request(message, headers=headers)
        if not isinstance(verdict, InboundModernRoute) or verdict.protocol_version != MODERN:
            return None
        if declares_tasks(verdict.client_capabilities):
            return None  # the SDK path decides whether it runs as a task
        if not await self.gateway.forwards(name):
            return None
        tool = self.gateway.known_tools[name]
        if validate_mcp_param_headers(tool.input_schema, arguments, headers) is not None:
            return None
        meta = _mapping(params.get("_meta"))
        return _Call(
            request_id=request_id,
            tool=name,
            arguments=arguments,
            caller=caller_from(verdict.client_info, headers, meta, self.gateway.spec.name),
            param_headers={k: v for k, v in headers.items() if k.startswith(MCP_PARAM_HEADER_PREFIX)},
        )


@dataclass(frozen=True)
class _Call:
    request_id: int | str
    tool: str
    arguments: dict[str, Any]
    caller: Caller
    param_headers: dict[str, str]


class _Forwarded:
    """One call through the fast path, from the boundary to the client's answer."""

    _ids = itertools.count(1)  # the gateway's JSON-RPC ids upstream, unique in the process

    def __init__(self, gateway: UpstreamGateway, pool: LedgerPool, call: _Call, receive: Receive, send: Send) -> None:
        self.gateway = gateway
        self.pool = pool
        self.call = call
        self.receive = receive
        self.send = send
        self.replied = False

    async def run(self) -> None:
        gateway, call = self.gateway, self.call
        try:
            facts, mcp_facts = await gateway.call_facts(call.tool, call.arguments, call.request_id, MODERN)
            stopped = asyncio.Event()
            entered = await gateway.enter_on(self.pool, call.caller, facts, mcp_facts, stopped)
            try:
                await self._forward(entered, facts, mcp_facts, stopped)
            finally:
                entered.unwatch()
        except Exception as exc:  # answered as the SDK's server answers a handler's error
            if self.replied:
                raise
            await self._error(MCPError.from_error_data(modern_error_data(exc)))

    async def _forward(
        self, entered: Entered, facts: dict[str, Any], mcp_facts: dict[str, Any], stopped: asyncio.Event
    ) -> None:
        gateway, item_id = self.gateway, entered.item_id
        upstream_request_id = next(self._ids)
        sent = UpstreamId(item_id, facts, upstream_request_id)
        progress = ProgressSeen(token=f"stopdesk-item-{item_id}")
        answer = asyncio.ensure_future(self._upstream(item_id, upstream_request_id, progress))
        watch = asyncio.ensure_future(self._stop_confirmed(item_id, stopped, progress))
        gone = asyncio.ensure_future(self._client_gone())
        try:
            done, _ = await asyncio.wait({answer, watch, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (answer, watch, gone):
                if not waiting.done():
                    waiting.cancel()  # the upstream's call: its stream closes, which is its cancel
            await asyncio.gather(answer, watch, gone, return_exceptions=True)
        if answer not in done and gone in done:  # the client's cancel
            await asyncio.shield(in_thread(client_cancelled, upstream_id=sent))
            return
        if answer not in done and watch.exception() is None:  # Stop's cancel
            await record_cancelled(item_id, ACTOR, mcp_facts, upstream_request_id)
            gateway.upstream.close_task(entered.task_id)
            await self._error(await stopped_error(entered.task_id, sent))
            return
        error = answer.exception() if answer in done else watch.exception()
        if error is not None:
            await self._failed(item_id, sent, mcp_facts, error)
            return
        result = answer.result()
        outcome = outcome_text(result.get("content"))
        recorded = Answer(sent, succeeded=not result.get("isError"), outcome=outcome, settle=False)
        reply = {"jsonrpc": "2.0", "id": self.call.request_id, "result": result}
        # Whether the task settled is asked once the session's calls are quiet (`settling.py`).
        if answer_may_follow_reply(mcp_facts, idempotent=self.call.tool in gateway.spec.idempotent_tools):
            try:
                await self._reply(reply)
            finally:  # recorded even if the client is gone by the time its answer is sent
                try:
                    await recorded.record_on(self.pool)
                except Exception:  # the item's lease lapses and the reconciler settles it
                    log.exception("forwarded call of item %s: answered, but its answer was not recorded", item_id)
                else:
                    gateway.settle_checks.after_answer(entered.task_id)
            return
        await recorded.record_on(self.pool)
        gateway.settle_checks.after_answer(entered.task_id)
        await self._reply(reply)

    async def _upstream(self, item_id: int, upstream_request_id: int, progress: ProgressSeen) -> dict[str, Any]:
        """The call sent upstream; its result, or MCPError with the upstream's error."""
        call = self.call
        meta = {
            PROTOCOL_VERSION_META_KEY: MODERN,
            CLIENT_INFO_META_KEY: UPSTREAM_CLIENT_INFO,
            CLIENT_CAPABILITIES_META_KEY: {},
            "stopdesk_item": str(item_id),
            "progressToken": progress.token,
        }
        body = {
            "jsonrpc": "2.0",
            "id": upstream_request_id,
            "method": "tools/call",
            "params": {"name": call.tool, "arguments": call.arguments, "_meta": meta},
        }
        headers = {
            **self.gateway.spec.http_headers(),
            **call.param_headers,
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
            "mcp-name": call.tool,
        }
        session = self.gateway.fast_session()
        async with session.post(self.gateway.spec.url, data=json.dumps(body), headers=headers) as response:
            if response.content_type == "text/event-stream":
                message = await _answer_in_stream(response, upstream_request_id, progress)
            else:
                message = await response.json(content_type=None) if response.status < 500 else None
            if not isinstance(message, dict) or message.get("id") != upstream_request_id:
                raise ConnectionError(f"the upstream answered HTTP {response.status} without the call's answer")
        if isinstance(message.get("error"), dict):
            error = message["error"]
            code, words = int(error.get("code", INTERNAL_ERROR)), str(error.get("message", ""))
            raise MCPError(code=code, message=words, data=error.get("data"))
        result = message.get("result")
        if not isinstance(result, dict):
            raise ConnectionError("the upstream's answer has no result")
        return result

    async def _stop_confirmed(self, item_id: int, stopped: asyncio.Event, progress: ProgressSeen) -> None:
        """Returns once the ledger says the item's task was stopped: woken by the pushed Stop, and
        every `poll_s` in any case (the item's heartbeat, which keeps its lease)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=self.gateway.poll_s)
            if await in_thread(item_heartbeat, item_id=item_id):
                progress.cancelled_at = time.monotonic()
                return

    async def _client_gone(self) -> None:
        """Returns when the client closes its stream (in 2026-07-28, its cancel)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _failed(self, item_id: int, sent: UpstreamId, mcp_facts: dict[str, Any], error: BaseException) -> None:
        await record_failure(item_id, ACTOR, error, mcp_facts)
        await in_thread(sent.record)
        if isinstance(error, MCPError):  # the upstream's own answer, passed on as it was
            await self._error(error)
            return
        # As the SDK's server answers a handler's error: no internals (the upstream's address) on the wire.
        log.warning("forwarded call of item %s: %s: %s", item_id, type(error).__name__, error)
        await self._error(MCPError(code=INTERNAL_ERROR, message="Internal server error"))

    async def _error(self, error: MCPError) -> None:
        payload = {"code": error.error.code, "message": error.error.message}
        if error.error.data is not None:
            payload["data"] = error.error.data
        status = ERROR_CODE_HTTP_STATUS.get(error.error.code, 200)
        await self._reply({"jsonrpc": "2.0", "id": self.call.request_id, "error": payload}, status)

    async def _reply(self, message: dict[str, Any], status: int = 200) -> None:
        body = json.dumps(message, separators=(",", ":")).encode()
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        self.replied = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


async def _answer_in_stream(
    response: aiohttp.ClientResponse, upstream_request_id: int, progress: ProgressSeen
) -> dict[str, Any] | None:
    """The call's answer from an SSE response, hearing the progress notifications before it."""
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
            continue
        if line or not data:
            continue
        message = json.loads("\n".join(data))
        data = []
        if isinstance(message, dict) and message.get("id") == upstream_request_id and "method" not in message:
            return message
        if isinstance(message, dict) and message.get("method") == "notifications/progress":
            params = _mapping(message.get("params"))
            progress.heard(
                params.get("progressToken"), params.get("progress"), params.get("total"), params.get("message")
            )
    return None


async def _body_of(receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body, and a `receive` that gives it again to whoever reads the request next
    (None for a body too large for this path, which the SDK then reads whole from the replay)."""
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None, _replay([message], receive)
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = message.get("more_body", False)
        if size > DEFAULT_MAX_REQUEST_BODY_SIZE and more:  # the SDK's app answers it with its own limit
            return None, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": True}], receive)
    body = b"".join(chunks)
    return body, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


def _replay(first: list[Message], receive: Receive) -> Receive:
    pending = list(first)

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return again


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _may_be_a_modern_call(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    headers = dict(scope["headers"])
    return headers.get(b"mcp-protocol-version") == MODERN.encode() and headers.get(b"mcp-method") == b"tools/call"
