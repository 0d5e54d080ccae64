"""A minimal JSON-RPC client for MCP streamable HTTP, for what the mcp SDK cannot send.

The SDK's `ClientSession.send_request` carries `tasks/get`, `tasks/cancel`, `tasks/result`
and `tasks/list` fine, but it validates every `tools/call` answer as a `CallToolResult`,
so a task-augmented `tools/call` (whose answer is a `CreateTaskResult`) only works raw.
This client speaks the 2025-11-25 handshake and nothing more: initialize, requests,
notifications, close.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from types import TracebackType
from typing import Any, Self

import httpx

PROTOCOL_VERSION = "2025-11-25"


class McpRpcError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class RawMcpSession:
    def __init__(self, url: str, *, timeout_s: float = 10.0, protocol_version: str = PROTOCOL_VERSION) -> None:
        self.url = url
        self.protocol_version = protocol_version
        self._http = httpx.Client(timeout=timeout_s)
        self._ids = itertools.count(1)
        self.session_id: str | None = None
        self.initialize_result: dict[str, Any] = {}

    def __enter__(self) -> Self:
        self.initialize_result = self.request(
            "initialize",
            {
                "protocolVersion": self.protocol_version,
                "capabilities": {},
                "clientInfo": {"name": "stopdesk-raw", "version": "1"},
            },
        )
        self.notify("notifications/initialized")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def request(self, method: str, params: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> Any:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = self._post(message, timeout_s)
        if "mcp-session-id" in response.headers:
            self.session_id = response.headers["mcp-session-id"]
        answer = _find_answer(response, request_id)
        if "error" in answer:
            error = answer["error"]
            raise McpRpcError(error["code"], error.get("message", ""), error.get("data"))
        return answer["result"]

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._post(message, None)

    def close(self) -> None:
        if self.session_id is not None:
            # The server may already be gone; then there is nothing to clean up.
            with contextlib.suppress(httpx.HTTPError):
                self._http.delete(self.url, headers=self._headers())
            self.session_id = None
        self._http.close()

    def _headers(self) -> dict[str, str]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": self.protocol_version,
        }
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def _post(self, message: dict[str, Any], timeout_s: float | None) -> httpx.Response:
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        response = self._http.post(self.url, content=json.dumps(message), headers=self._headers(), timeout=timeout)
        response.raise_for_status()
        return response


def _find_answer(response: httpx.Response, request_id: int) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                payload = json.loads(line[5:].strip() or "null")
                if isinstance(payload, dict) and payload.get("id") == request_id:
                    return payload
        raise McpRpcError(-32603, "no answer in the event stream")
    payload = response.json()
    if not isinstance(payload, dict):
        raise McpRpcError(-32603, "unexpected answer shape", payload)
    return payload
