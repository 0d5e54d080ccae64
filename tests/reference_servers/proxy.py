"""A recording reverse proxy for a Streamable HTTP MCP server: what the server received and what
it answered, message by message, with the session each belonged to. Responses stream through
(SSE included), so progress notifications pass at the moment the server sends them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


class WireRecorder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.messages: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []

    def note(self, direction: str, session: str, message: Any) -> None:
        with self.lock:
            self.messages.append({"dir": direction, "session": session, "at": time.time(), "msg": message})

    def received(self, method: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                m for m in self.messages if m["dir"] == "in" and (method is None or m["msg"].get("method") == method)
            ]

    def answers_to(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        """Every answer the server wrote for the request `request` (an "in" entry)."""
        rid, session = request["msg"].get("id"), request["session"]
        with self.lock:
            return [
                m
                for m in self.messages
                if m["dir"] == "out" and m["msg"].get("id") == rid and "method" not in m["msg"]
                if m["session"] == session or not session
            ]

    def notifications(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [m for m in self.messages if m["dir"] == "out" and m["msg"].get("method") == method]

    def app(self) -> Starlette:
        client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=600))

        async def forward(request: Request) -> StreamingResponse:
            body = await request.body()
            session = request.headers.get("mcp-session-id", "")
            with self.lock:
                self.headers_seen.append({k.lower(): v for k, v in request.headers.items()})
            if body:
                for message in _messages(body):
                    self.note("in", session, message)
            elif request.method == "DELETE":
                self.note("in", session, {"http": "DELETE"})
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
            upstream = client.build_request(request.method, self.upstream, content=body, headers=headers)
            response = await client.send(upstream, stream=True)
            answer_session = response.headers.get("mcp-session-id", session)

            async def relay() -> AsyncIterator[bytes]:
                buffer = b""
                try:
                    async for chunk in response.aiter_raw():
                        yield chunk
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            self._record_line(line, answer_session, response)
                    if buffer:
                        self._record_line(buffer, answer_session, response)
                finally:
                    await response.aclose()

            out_headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP}
            return StreamingResponse(relay(), status_code=response.status_code, headers=out_headers)

        return Starlette(routes=[Route("/mcp", forward, methods=["GET", "POST", "DELETE"])])

    def _record_line(self, line: bytes, session: str, response: httpx.Response) -> None:
        text = line.decode(errors="replace").strip()
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            if not text.startswith("data:"):
                return
            text = text[5:].strip()
        if not text:
            return
        try:
            self.note("out", session, json.loads(text))
        except ValueError:
            self.note("out", session, {"http": response.status_code, "raw": text[:300]})


def _messages(body: bytes) -> list[dict[str, Any]]:
    try:
        payload = json.loads(body)
    except ValueError:
        return [{"raw": body[:300].decode(errors="replace")}]
    return payload if isinstance(payload, list) else [payload]
