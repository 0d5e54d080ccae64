"""A mail outbox: sending is irreversible, and status is looked up by idempotency key.

- `POST /messages` with `Idempotency-Key`: sends once. A replay returns the same message
  (200, not 201) and never sends twice; the same key with a different body is 422. Without
  a key every POST sends, which is exactly the duplicate a drill can demonstrate.
- `GET /messages/{id}` and `GET /messages?idempotency_key=K`; the lookup is 404 when the
  outbox never received that key, which is how a caller whose send timed out learns that it
  did not land.
- There is no recall: `DELETE /messages/{id}` and `POST /messages/{id}/recall` are 405.

`accept_delay_s` holds a send after it arrives and before it is committed; a client that
gives up during the delay has still sent the mail. Faults as in the CRM: `fail_500`,
`fail_500_after_commit`, `hang`, `hang_after_commit` (global or per idempotency key).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stopdrill.sandbox.common import SandboxParty

FAIL_500 = "fail_500"
FAIL_500_AFTER_COMMIT = "fail_500_after_commit"
HANG = "hang"
HANG_AFTER_COMMIT = "hang_after_commit"


@dataclass
class Message:
    id: str
    idempotency_key: str | None
    to: str
    subject: str
    body: str
    request: dict[str, Any]
    status: str = "sent"
    sent_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "idempotency_key": self.idempotency_key,
            "to": self.to,
            "subject": self.subject,
            "body": self.body,
            "status": self.status,
            "sent_at": self.sent_at,
        }


class Outbox(SandboxParty):
    """State and behaviour; `app()` builds a fresh Starlette app over it.

    Python control: `configure(latency_s=..., accept_delay_s=...)`, `set_fault(...)`,
    `messages()`, `sent_count(key)`, `stats()`, `reset()`. HTTP: `/_control/*`.
    """

    FAULTS: ClassVar[frozenset[str]] = frozenset({FAIL_500, FAIL_500_AFTER_COMMIT, HANG, HANG_AFTER_COMMIT})
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = ("latency_s", "accept_delay_s")

    def __init__(self, *, latency_s: float = 0.0, accept_delay_s: float = 0.0) -> None:
        super().__init__(latency_s=latency_s)
        self.accept_delay_s = accept_delay_s
        self._messages: dict[str, Message] = {}
        self._by_key: dict[str, str] = {}
        self._next_id = 1

    def messages(self) -> list[dict[str, Any]]:
        with self.lock:
            return [m.to_json() for m in self._messages.values()]

    def sent_count(self, idempotency_key: str | None = None) -> int:
        """How many mails actually went out (for one key, or in total)."""
        with self.lock:
            return sum(1 for m in self._messages.values() if idempotency_key in (None, m.idempotency_key))

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self._messages.clear()
            self._by_key.clear()
            self._next_id = 1

    async def _send(self, request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        await self.arrive("send", key)
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body must be a JSON object")
        if not isinstance(body, dict) or not body.get("to"):
            return _error(400, "'to' is required")
        if self.has_fault(HANG, key):
            await self.hang()
        if self.has_fault(FAIL_500, key):
            return _error(500, "internal error")
        with self.lock:
            delay = self.accept_delay_s
        if delay > 0:
            # Shielded: once the outbox has the request, a client hanging up does not stop
            # the send. Only the server stopping (a crash) loses it.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(delay)
        with self.lock:
            existing = self._messages.get(self._by_key.get(key, "")) if key else None
            if existing is not None:
                if existing.request != body:
                    return _error(422, "Idempotency-Key was already used with a different message")
                return JSONResponse(existing.to_json(), status_code=200)
            message = Message(
                id=f"msg-{self._next_id}",
                idempotency_key=key,
                to=str(body["to"]),
                subject=str(body.get("subject", "")),
                body=str(body.get("body", "")),
                request=dict(body),
            )
            self._next_id += 1
            self._messages[message.id] = message
            if key:
                self._by_key[key] = message.id
            sent = message.to_json()
        if self.has_fault(HANG_AFTER_COMMIT, key, message.id):
            await self.hang()
        if self.has_fault(FAIL_500_AFTER_COMMIT, key, message.id):
            return _error(500, "internal error")
        return JSONResponse(sent, status_code=201)

    async def _list(self, request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        await self.arrive("lookup" if key else "list", key)
        with self.lock:
            if key is None:
                return JSONResponse({"data": [m.to_json() for m in self._messages.values()]})
            message = self._messages.get(self._by_key.get(key, ""))
            if message is None:
                return _error(404, f"no message was received with idempotency key {key!r}")
            return JSONResponse(message.to_json())

    async def _get(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]
        await self.arrive("get", message_id)
        with self.lock:
            message = self._messages.get(message_id)
            if message is None:
                return _error(404, f"no message {message_id!r}")
            return JSONResponse(message.to_json())

    async def _no_recall(self, request: Request) -> Response:
        await self.arrive("recall", request.path_params["message_id"])
        return _error(405, "sent mail cannot be recalled", headers={"Allow": "GET"})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/messages", self._send, methods=["POST"]),
                Route("/messages", self._list, methods=["GET"]),
                Route("/messages/{message_id}", self._get, methods=["GET"]),
                Route("/messages/{message_id}", self._no_recall, methods=["DELETE", "PUT", "PATCH"]),
                Route("/messages/{message_id}/recall", self._no_recall, methods=["POST"]),
                *self.control_routes(),
            ]
        )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)
