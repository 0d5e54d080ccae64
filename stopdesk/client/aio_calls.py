"""How `AsyncClient` sends its calls when it owns the connections: aiohttp.

A framework run over HTTP makes about three calls a step (a model request's draft, a tool call's
registration, the results), on the same event loop and interpreter as the agent itself. Measured
against one local server, a call costs the client's process about 1.3 to 2 ms of CPU through
httpx and 0.4 ms through aiohttp (which writes a request in one send and parses the answer in C);
that CPU is taken from the agent's own steps. So the calls go through aiohttp, and everything the
caller sees stays as it was: the answer is read by `read_answer`, and a failure is raised as the
httpx error it would have been (`httpx.ConnectError`, `httpx.TimeoutException`, ...), which the
retry policy (`transport.should_retry`) and every caller already handle. A client given its own
`http=` (an `httpx.AsyncClient`: proxies, TLS settings) sends through it instead. The watches keep
their own httpx pools (`watch.py`): streamed answers and redirects, a few requests a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx


@dataclass(frozen=True)
class Answer:
    """What `read_answer` reads of a response."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


class CallSession:
    """Connections for the calls of one client, at most `limit` at once, made on first use in the
    event loop that uses them (a session belongs to one loop; a client used from another loop later
    gets a session of its own there)."""

    def __init__(self, *, timeout: float, limit: int, headers: dict[str, str]) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self._limit = limit
        self.headers = headers
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers=self.headers, cookie_jar=aiohttp.DummyCookieJar()
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, url: str, *, json_body: Any, headers: dict[str, str]) -> Answer:
        session = self._current()
        data = None
        if json_body is not None:
            # As httpx encodes `json=`, so the server reads the same bytes either way.
            data = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers = {**headers, "Content-Type": "application/json"}
        try:
            async with session.request(method, url, data=data, headers=headers, allow_redirects=False) as response:
                return Answer(response.status, await response.read())
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc)) from exc
        except TimeoutError as exc:  # aiohttp's read timeout is one
            raise httpx.ReadTimeout(str(exc) or "timed out reading the answer") from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        # A session made on another loop is left: its connections belong to that loop (and went
        # with it, when it closed).
        if self._session is not None and not self._session.closed and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(RuntimeError):
                await self._session.close()
        self._session = None
