"""A request read and a JSON answer sent on raw ASGI, for the paths served outside Django's request
cycle (`stopdesk.asgi`: the stop watches, the agent door)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def request_headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers, by lower-case name."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


async def read_body(receive: Any, keep_at_most: int | None = None) -> bytes | None:
    """The request's body; None if the client left before sending all of it. Past `keep_at_most`
    bytes no more is kept (the caller refuses a body that large by its Content-Length, or by what
    it cannot parse), though all of it is read."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if keep_at_most is None or size - len(chunk) <= keep_at_most:
            chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_json(send: Any, status: int, body: dict[str, Any], headers: Iterable[tuple[str, str]] = ()) -> None:
    extra = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), *extra]}
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
