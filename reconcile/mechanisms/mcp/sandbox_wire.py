"""The sandbox MCP server's front door: which revisions it speaks, and what reached it.

`WireGate` wraps the SDK's Streamable HTTP app. It refuses the revision it was told not to
speak, the way real servers do: a server that speaks only 2025-11-25 answers a request that
comes without a session (a 2026-07-28 request: no `initialize`, no `Mcp-Session-Id`) with HTTP
400 "Server not initialized", as `@modelcontextprotocol/server-everything` does; one that speaks
only 2026-07-28 refuses `initialize` with -32022 and the versions it supports.

It also records every JSON-RPC message that arrived, so a test can see how a cancel looked on
the wire: a `notifications/cancelled` with the request id it names, or a request whose response
stream the client closed before the answer was sent (2026-07-28 over HTTP).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, MutableMapping
from typing import Any

BOTH = "both"
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
SPEAKS = (BOTH, LEGACY, MODERN)
UNSUPPORTED_PROTOCOL_VERSION = -32022

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class WireLog:
    """What arrived, in order: method, JSON-RPC id, the revision header, and for a request
    whether its response stream was closed by the client before the answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []

    def add(self, message: Any, revision: str, *, refused: bool = False) -> dict[str, Any]:
        entry: dict[str, Any] = {"revision": revision}
        if isinstance(message, dict):
            entry["method"] = message.get("method")
            if "id" in message:
                entry["id"] = message["id"]
            params = message.get("params") or {}
            if message.get("method") == "notifications/cancelled" and isinstance(params, dict):
                entry["request_id"] = params.get("requestId")
            if message.get("method") == "tools/call" and isinstance(params, dict):
                entry["tool"] = params.get("name")
        if refused:
            entry["refused"] = True
        with self._lock:
            self._entries.append(entry)
        return entry

    def mark_stream_closed(self, entry: dict[str, Any]) -> None:
        with self._lock:
            entry["stream_closed"] = True

    def entries(self, method: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._entries if method in (None, e.get("method"))]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class WireGate:
    """ASGI middleware in front of the MCP app (see the module docstring)."""

    def __init__(self, app: Any, log: WireLog, speaks: Callable[[], str]) -> None:
        self.app = app
        self.log = log
        self.speaks = speaks

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        message = _parse(body)
        revision = headers.get("mcp-protocol-version", "")
        refusal = _refusal(self.speaks(), message, headers)
        entry = self.log.add(message, revision, refused=refusal is not None)
        if headers.get("mcp-name"):
            entry["mcp_name"] = headers["mcp-name"]  # 2026-07-28: a task request names its task here
        if refusal is not None:
            await _send_json(send, 400, refusal)
            return
        await self.app(scope, self._replaying(body, receive, entry), self._watching(send, entry))

    def _replaying(self, body: bytes, receive: Any, entry: dict[str, Any]) -> Any:
        """Hand the app the body we read, then the client's own messages: a disconnect before the
        answer was sent is the client closing the response stream."""
        state = {"replayed": False}

        async def replay() -> Message:
            if not state["replayed"]:
                state["replayed"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: Message = await receive()
            if message["type"] == "http.disconnect" and not entry.get("answered") and "id" in entry:
                self.log.mark_stream_closed(entry)
            return message

        return replay

    @staticmethod
    def _watching(send: Any, entry: dict[str, Any]) -> Any:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                entry["answered"] = True
            await send(message)

        return watched


def _refusal(speaks: str, message: Any, headers: dict[str, str]) -> dict[str, Any] | None:
    method = message.get("method") if isinstance(message, dict) else None
    request_id = message.get("id") if isinstance(message, dict) else None
    if speaks == LEGACY and method != "initialize" and "mcp-session-id" not in headers:
        return _error(request_id, -32000, "Bad Request: Server not initialized")
    if speaks == MODERN and method == "initialize":
        return _error(
            request_id,
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
            {"supported": [MODERN], "requested": (message.get("params") or {}).get("protocolVersion")},
        )
    return None


def _error(request_id: Any, code: int, text: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _parse(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError:
        return None


async def _read_body(receive: Any) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _send_json(send: Any, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
