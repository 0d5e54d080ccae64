"""Retry policy and answer handling shared by the sync and async clients."""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from stopdesk.client.calls import Call
from stopdesk.protocol.errors import ServerError, StopRequested, error_from_response

try:  # optional: the client works without OpenTelemetry installed
    from opentelemetry.propagate import inject
except ImportError:  # pragma: no cover - exercised only where opentelemetry-api is absent
    inject = None  # type: ignore[assignment]

API_PREFIX = "/api/v1"
RETRY_STATUSES = frozenset({502, 503, 504})
# The watches' own pool: one long poll per watched task holds one connection for as long as it
# waits, so they never share the (bounded) pool the boundary passes use, and none is turned away.
WATCH_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None)
# The async client's other calls: at most this many at once (and as many connections), the rest
# wait their turn outside the pool (`AsyncClient._run`). httpcore's pool (an `http=` of your own),
# on every request that enters or leaves it, compares each queued request with each connection:
# hundreds of runs settling at once (each reporting its Stop) made that seconds of the event loop's
# time, and the Stops still unheard waited behind it.
CALLS_IN_FLIGHT = 32


def api_base(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base if base.endswith(API_PREFIX) else base + API_PREFIX


class AgentDoor:
    """Where a client sends the registration before each tool call and the calls' results
    (`Call.agent_door`): the watch server once it is known, which serves them on its event loop
    (`stopdesk.api.agent_door`), else the web door. A watch server that cannot be reached (the
    request never left) sends them to the web door for `pause_s`, so an agent's work never waits on
    the watch server being up."""

    def __init__(self, pause_s: float = 30.0) -> None:
        self.pause_s = pause_s
        self._unreachable_until = 0.0

    def base(self, call: Call[Any], base: str, watch_base: str) -> str:
        if call.agent_door and watch_base != base and time.monotonic() >= self._unreachable_until:
            return watch_base
        return base

    def unreachable(self, call: Call[Any], base: str, watch_base: str, error: Exception) -> bool:
        """Whether `error` is the watch server not answering a connection for this call (which
        then goes to the web door at once: it never left)."""
        if not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return False
        if self.base(call, base, watch_base) == base:
            return False
        self._unreachable_until = time.monotonic() + self.pause_s
        return True


def headers_for(call: Call[Any]) -> dict[str, str]:
    headers = {"Idempotency-Key": call.key} if call.key else {}
    if inject is not None:
        # W3C traceparent of the agent's current span, so stopdesk's spans join the agent's trace.
        inject(headers)
    return headers


def should_retry(
    call: Call[Any], attempt: int, retries: int, *, error: Exception | None = None, status: int | None = None
) -> bool:
    """Retry only when the request cannot do its work twice: it never left (connect failures), or
    the server will replay the first answer (reads, idempotent operations, Idempotency-Key)."""
    if attempt >= retries:
        return False
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return True
    if error is not None:
        return call.safe and isinstance(error, httpx.TransportError)
    return call.safe and status in RETRY_STATUSES


def backoff(attempt: int, base: float) -> float:
    return base * (2**attempt) * (0.5 + random.random())


def read_answer[T](call: Call[T], response: httpx.Response) -> T:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_from_response(response.status_code, body)
    if not isinstance(body, dict):
        raise ServerError(f"HTTP {response.status_code} without a JSON object.", code="bad_response")
    result = call.parse(body)
    if call.raise_on_stop and body.get("stop_requested"):
        raise StopRequested(
            "Stop was requested; stop between steps and report with cancel().",
            item=body.get("item"),
            state=body.get("state"),
        )
    return result
