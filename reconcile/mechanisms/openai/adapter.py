"""OpenAI background responses: created through the official `openai` SDK, cancelled and read back
with the wire protocol's two documented calls.

- create: background=True, max_retries=0 (an SDK retry after a timeout can start a second run that
  can never be found again: there is no list endpoint), metadata linking back to the item, and the
  response id stored as the item's handle the moment create returns.
- cancel: POST /responses/{id}/cancel once, then always retrieve. 400/404/409 on cancel mean "look
  it up". A `cancelled` is watched for a while: it has been seen to turn `completed`.
- timeouts, connection errors and 5xx are retried with backoff by the engine until the deadline.
- cancel and read-back are two plain requests (`httpx`, one pooled client per endpoint, with the
  same bearer auth and no retries; 404 is "unknown", other 4xx/5xx a status, transport errors
  unreachable, as with the SDK's exceptions). The SDK's request pipeline (an options model per call, header merging, URL
  building) and its Response model were more than half of a call's CPU, which is what bounds a
  canceller's throughput when one process cancels thousands of responses. For the same reason the
  two requests go straight to the endpoint's transport (its pool, TLS, proxy and timeouts) with the
  client's headers: httpx's own per-request pipeline (URL merging, cookies, auth and redirect
  handling, event hooks) cost more CPU than the transport itself. The transport is one we build
  and keep (`endpoint_transport`), handed to the plain client as its `transport`, so the client and
  the direct path share one pool through httpx's public API only.
- the read-back also lists the tool calls the response launched itself (`launched_tool_calls`):
  hosted `mcp_call`s, code interpreter, searches, function calls awaiting the application.
  Cancelling the response does not undo them, so the services record each one under the
  response's item.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, urlsplit

import httpx
import httpx2
import openai as sdk

from reconcile.mechanisms.base import Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen
from stopdesk.record_ids import record_id_problem

STATUS = {
    "queued": Seen.RUNNING,
    "in_progress": Seen.RUNNING,
    "completed": Seen.COMPLETED,
    "failed": Seen.FAILED,
    "cancelled": Seen.CANCELLED,
    "incomplete": Seen.FAILED,  # final, with a partial answer; the reason is kept as evidence
}
LOOK_IT_UP = (400, 404, 409)

_clients: dict[tuple[str, str, str, float], Any] = {}
_clients_lock = threading.Lock()
DEFAULT_BASE_URL = "https://api.openai.com/v1"

# A pooled connection left idle this long is dropped rather than reused. It must be well inside
# the idle timeout of the server at the other end (5 s for uvicorn, which serves the stand-in, and
# for many proxies): with the two equal, a loaded client reuses a connection at the moment the
# server closes it, and the request fails with "Server disconnected" before it was read. The engine
# retries a cancel or a read-back, but a create is never retried, so that run would be lost.
KEEPALIVE_S = 2.0
# As many keep-alive connections as a canceller has calls in flight (the SDK's default keeps 100).
KEEPALIVE_CONNECTIONS = 100


def _forget_parent_clients() -> None:
    """A forked process (a prefork worker, a canceller process) must not write to its parent's
    pooled sockets: two processes on one keep-alive connection interleave their requests. Nor
    inherit the lock in whatever state another thread of the parent left it."""
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_clients)


def _shared[T](
    kind: type[T], base_url: str | None, api_key: str | None, timeout_s: float, build: Callable[[str, str], T]
) -> T:
    """The one client of `kind` (one connection pool) per endpoint, key and timeout, built on first
    use. Unset, the endpoint and key come from OPENAI_BASE_URL and OPENAI_API_KEY, as for the SDK."""
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or "sk-none"
    key = (kind.__name__, base_url, api_key, timeout_s)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = build(base_url, api_key)
        return cast(T, client)


def client_for(*, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 10.0) -> sdk.OpenAI:
    """The SDK client creates go through, with the SDK's retries off: the engine retries, with a
    deadline the SDK does not know about (and a create is never retried)."""

    def build(url: str, key: str) -> sdk.OpenAI:
        # The SDK's own HTTP library (httpx2), with the same pool limits as the plain client.
        limits = httpx2.Limits(max_keepalive_connections=KEEPALIVE_CONNECTIONS, keepalive_expiry=KEEPALIVE_S)
        http = sdk.DefaultHttpxClient(timeout=timeout_s, limits=limits)
        return sdk.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http)

    return _shared(sdk.OpenAI, base_url, api_key, timeout_s, build)


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, with NO_PROXY
    honoured), or None: what httpx's client would route the endpoint through with `trust_env`,
    read with the standard library's own proxy rules."""
    proxies = urllib.request.getproxies()
    parts = urlsplit(url)
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and "://" not in proxy:
        proxy = "http://" + proxy  # as httpx reads a proxy given without a scheme
    return proxy or None


def endpoint_transport(
    *, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> httpx.HTTPTransport:
    """The one transport (connection pool, TLS, proxy) per endpoint, key and timeout that both the
    plain client and the direct cancel and read-back path send through. Built here, with the pool
    limits and the environment's certificates and proxy the client would have given its own."""

    def build(url: str, key: str) -> httpx.HTTPTransport:
        return httpx.HTTPTransport(
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS, keepalive_expiry=KEEPALIVE_S
            ),
            trust_env=True,
            proxy=environment_proxy(url),
        )

    return _shared(httpx.HTTPTransport, base_url, api_key, timeout_s, build)


def http_client_for(
    *, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> httpx.Client:
    """The plain client the cancel and the read-back use: the same endpoint, key and bearer auth
    as `client_for`, no retries (the engine retries), on the endpoint's transport."""
    transport = endpoint_transport(base_url=base_url, api_key=api_key, timeout_s=timeout_s)

    def build(url: str, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=url.rstrip("/") + "/",
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
        )

    return _shared(httpx.Client, base_url, api_key, timeout_s, build)


@dataclass(frozen=True)
class PlainEndpoint:
    """What a plain request to one endpoint needs, worked out once: the endpoint's transport (the
    plain client's, a proxy's if the environment names one), the client's headers and its
    timeouts. Sending through it costs about half the CPU of `client.request`, which builds and
    merges all of this again on every call."""

    base_url: str
    transport: httpx.BaseTransport
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]

    def send(self, method: str, path: str) -> httpx.Response:
        """`method` on `path` (relative to the endpoint), the body read and the connection let go.
        Raises httpx's transport errors, as the client does."""
        request = httpx.Request(method, self.base_url + path, headers=self.headers, extensions=self.extensions)
        response = self.transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response


def plain_endpoint_for(
    *, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> PlainEndpoint:
    """The cancel's and the read-back's way to the endpoint of `http_client_for` (whose transport,
    and so whose pool, it shares)."""
    client = http_client_for(base_url=base_url, api_key=api_key, timeout_s=timeout_s)
    transport = endpoint_transport(base_url=base_url, api_key=api_key, timeout_s=timeout_s)

    def build(url: str, key: str) -> PlainEndpoint:
        return PlainEndpoint(
            base_url=str(client.base_url),
            transport=transport,
            headers=list(client.headers.raw),
            extensions={"timeout": client.timeout.as_dict()},
        )

    return _shared(PlainEndpoint, base_url, api_key, timeout_s, build)


def observe(response: dict[str, Any]) -> Observation:
    """A Response object as the wire protocol has it (the fields are the documented ones)."""
    status = str(response.get("status") or "")
    seen = STATUS.get(status, Seen.RUNNING)
    detail: dict[str, Any] = {"response_id": response.get("id"), "status": status}
    if response.get("incomplete_details") is not None:
        detail["incomplete_reason"] = response["incomplete_details"].get("reason")
    if response.get("error") is not None:
        detail["error"] = response["error"].get("message")
    launched = launched_tool_calls(response)
    if launched:
        detail["tool_calls"] = launched
    return Observation(seen, remote_status=status, detail=detail)


# Output item types that are tool calls, and whether one can change anything outside.
READ_ONLY_TYPES = frozenset({"web_search_call", "file_search_call", "tool_search_call"})
TOOL_CALL_TYPES = READ_ONLY_TYPES | frozenset(
    {"mcp_call", "function_call", "custom_tool_call", "code_interpreter_call", "computer_call", "shell_call"}
)


def launched_tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool call among a Response's output items, as plain facts: type, server label, tool,
    call id, status, error (as text), its arguments (what it was asked to do: who a mail went to),
    the record its output names, and whether it is read-only (searches; an MCP tool whose server
    listed it with `readOnlyHint` in the same response's `mcp_list_tools`). The output itself is
    not kept: it can hold anything the tool read."""
    output = response.get("output") or []
    read_only_tools = {
        (listing.get("server_label"), tool.get("name"))
        for listing in output
        if listing.get("type") == "mcp_list_tools"
        for tool in listing.get("tools") or []
        if (tool.get("annotations") or {}).get("readOnlyHint") or (tool.get("annotations") or {}).get("read_only")
    }
    calls = []
    for item in output:
        kind = item.get("type")
        if kind not in TOOL_CALL_TYPES:
            continue
        label = str(item.get("server_label") or "")
        name = str(item.get("name") or kind)
        calls.append(
            {
                "type": kind,
                "server_label": label,
                "tool": name,
                "call_id": str(item.get("call_id") or item.get("id") or ""),
                "status": str(item.get("status") or ""),
                "error": error_text(item.get("error")),
                "arguments": _arguments(item),
                "record": named_record(item.get("output")),
                "read_only": kind in READ_ONLY_TYPES or (label, name) in read_only_tools,
            }
        )
    return calls


# Arguments longer than this (as JSON) are kept shortened, as text; an error's text likewise.
ARGUMENTS_KEPT = 4000
ERROR_KEPT = 2000


def error_text(error: Any) -> str | None:
    """A tool call's error as text: a protocol or HTTP error's message, or the text blocks of an
    MCP tool's error content (a list of content blocks, never its Python repr)."""
    if not error:
        return None
    if isinstance(error, dict):
        text = str(error.get("message") or _text(error.get("content")) or error.get("type") or "error")
    else:
        text = _text(error)
    return text[:ERROR_KEPT] or None


def _text(value: Any) -> str:
    """MCP content (a string, a content block, or a list of them) as its text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return str(value["text"]) if "text" in value else json.dumps(value)
    if isinstance(value, list):
        return "\n".join(filter(None, (_text(block) for block in value)))
    return str(value)


def _arguments(item: dict[str, Any]) -> dict[str, Any] | None:
    """What the call was asked to do, as a JSON object: an MCP or function call's arguments, a
    search's action; anything else (a code interpreter's code, arguments that are not an object,
    or too long) as `{"text": ...}`, shortened."""
    raw = item.get("arguments", item.get("action", item.get("code")))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {"text": raw[:ARGUMENTS_KEPT]}
    if raw is None or (isinstance(raw, dict) and len(json.dumps(raw)) <= ARGUMENTS_KEPT):
        return raw
    return {"text": json.dumps(raw)[:ARGUMENTS_KEPT]}


def named_record(output: Any) -> dict[str, str] | None:
    """The record a call's output names: a JSON object with an `id` (and maybe a `version`), as
    a create or an update answers; None otherwise, and for an id that cannot be sent back to its
    system as one path segment (the ledger would refuse it, and with it the call's record)."""
    try:
        body = json.loads(output) if isinstance(output, str) else output
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("id"), str | int) or isinstance(body.get("id"), bool):
        return None
    record_id, version = str(body["id"]), body.get("version")
    if record_id_problem(record_id) is not None:
        return None
    return {"id": record_id, "version": "" if version is None else str(version)[:200]}


class OpenAIResponses(Mechanism):
    name = "openai"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})
    defaults = MechanismSettings(
        call_timeout_s=10.0,
        deadline_s=300.0,
        backoff_initial_s=1.0,
        backoff_max_s=30.0,
        recheck_interval_s=5.0,
        recheck_after_cancelled_s=600.0,
        # The flip watch reads back after 5 s (recheck_interval_s), then 15 s, 45 s, 135 s, 405 s
        # later: five read-backs in the window instead of one every 5 s (120).
        watch_growth=3.0,
        concurrency=32,
    )

    def _http(self, item: ItemRef) -> PlainEndpoint:
        # The endpoint and the key are configuration, bound together: never an item's (a runtime
        # that could name the endpoint would receive the server's key).
        return plain_endpoint_for(
            base_url=self.settings.options.get("base_url"),
            api_key=self.settings.options.get("api_key"),
            timeout_s=self.settings.call_timeout_s,
        )

    def cancel(self, item: ItemRef) -> Observation:
        if not item.handle:
            return self.inspect(item)
        cancel_answer: dict[str, Any]
        answered = False
        try:
            # The read-back below decides, so the cancel's body is never read.
            status = self._http(item).send("POST", f"responses/{quote(item.handle, safe='')}/cancel").status_code
        except httpx.HTTPError as exc:
            cancel_answer = {"cancel": _transport_error(exc)}
        else:
            if status < 400:
                cancel_answer, answered = {"cancel": "accepted"}, True
            elif status not in LOOK_IT_UP:
                cancel_answer = {"cancel": f"HTTP {status}"}
            else:
                # Already final, unknown, or conflicting: the read-back below says which.
                cancel_answer, answered = {"cancel": f"HTTP {status}; looked it up"}, status != 409
        read_back = self.inspect(item)
        detail = {**read_back.detail, **cancel_answer}
        if read_back.seen == Seen.RUNNING and not answered:
            # The cancel did not land and the run goes on: retry the cancel after a backoff.
            return Observation(Seen.UNREACHABLE, remote_status=f"cancel {cancel_answer['cancel']}", detail=detail)
        return Observation(read_back.seen, read_back.remote_status, read_back.message, detail, cancel_sent=answered)

    def inspect(self, item: ItemRef) -> Observation:
        if not item.handle:
            return Observation(
                Seen.UNKNOWABLE,
                remote_status="no response id",
                message="Create never answered, so the response id is unknown, and responses cannot be listed.",
            )
        try:
            answer = self._http(item).send("GET", f"responses/{quote(item.handle, safe='')}")
            if answer.status_code == 404:
                return Observation(
                    Seen.UNKNOWABLE, remote_status="HTTP 404", message="The response is unknown or past its retention."
                )
            if answer.status_code >= 400:
                return Observation(Seen.UNREACHABLE, remote_status=f"HTTP {answer.status_code}")
            response = answer.json()
        except httpx.HTTPError as exc:
            return Observation(Seen.UNREACHABLE, remote_status=_transport_error(exc))
        except ValueError:  # not JSON: a proxy's error page, a truncated body
            return Observation(Seen.UNREACHABLE, remote_status="unreadable answer")
        if not isinstance(response, dict):
            return Observation(Seen.UNREACHABLE, remote_status="unreadable answer")
        return observe(response)


def _transport_error(exc: httpx.HTTPError) -> str:
    """A transport failure in the SDK's words, so the evidence reads the same as for a create."""
    return "APITimeoutError" if isinstance(exc, httpx.TimeoutException) else "APIConnectionError"


ADAPTER = OpenAIResponses
