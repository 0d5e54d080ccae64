"""A webhook receiver that behaves like a careful real one (Standard Webhooks).

- `POST /hooks`: verifies `webhook-signature` over `webhook-id.webhook-timestamp.body` with the
  endpoint secret (the `standardwebhooks` package, 5-minute timestamp tolerance). A bad or
  missing signature is 401 and nothing is recorded. A valid delivery is recorded once per
  `webhook-id`; a repeat (the sender retried after losing our answer) is 200 with
  `"duplicate": true` and counted, never recorded again.
- `GET /hooks`: what was received: `deliveries` (one per webhook-id, in arrival order),
  `duplicates`, `rejected`.
- Faults: `fail_500` (answer 500 without recording), `hang` (park the request before recording),
  `hang_after_record` (record, then never answer: the sender cannot know it landed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stopdrill.sandbox.common import SandboxParty

FAIL_500 = "fail_500"
HANG = "hang"
HANG_AFTER_RECORD = "hang_after_record"
DEMO_SECRET = "whsec_c2FuZGJveC13ZWJob29rLXNlY3JldC0wMQ=="  # noqa: S105 - the sandbox's, public by design


@dataclass
class Received:
    webhook_id: str
    timestamp: str
    payload: dict[str, Any]
    received_at: float = field(default_factory=time.time)
    arrivals: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "webhook_id": self.webhook_id,
            "timestamp": self.timestamp,
            "payload": self.payload,
            "received_at": self.received_at,
            "arrivals": self.arrivals,
            "verified": True,
        }


class WebhookReceiver(SandboxParty):
    FAULTS: ClassVar[frozenset[str]] = frozenset({FAIL_500, HANG, HANG_AFTER_RECORD})

    def __init__(self, *, secret: str = DEMO_SECRET, latency_s: float = 0.0) -> None:
        super().__init__(latency_s=latency_s)
        self.secret = secret
        self._received: dict[str, Received] = {}
        self.duplicates = 0
        self.rejected: list[str] = []

    def deliveries(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.to_json() for r in self._received.values()]

    def received(self, webhook_id: str) -> Received | None:
        with self.lock:
            return self._received.get(webhook_id)

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self._received.clear()
            self.duplicates = 0
            self.rejected = []

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        webhook_id = request.headers.get("webhook-id", "")
        await self.arrive("hook", webhook_id or None)
        try:
            payload = Webhook(self.secret).verify(body, dict(request.headers))
        # standardwebhooks raises a bare ValueError for a signature without "v1," and
        # UnicodeDecodeError for a body that is not UTF-8: both are a bad request, not a crash.
        except (WebhookVerificationError, ValueError, UnicodeDecodeError) as exc:
            with self.lock:
                self.rejected.append(f"{webhook_id or '(no id)'}: {type(exc).__name__}: {exc}")
            return JSONResponse({"error": f"signature verification failed: {exc}"}, status_code=401)
        if self.has_fault(HANG, webhook_id):
            await self.hang()
        if self.has_fault(FAIL_500, webhook_id):
            return JSONResponse({"error": "internal error"}, status_code=500)
        with self.lock:
            existing = self._received.get(webhook_id)
            if existing is not None:
                existing.arrivals += 1
                self.duplicates += 1
            else:
                self._received[webhook_id] = Received(webhook_id, request.headers.get("webhook-timestamp", ""), payload)
        if self.has_fault(HANG_AFTER_RECORD, webhook_id):
            await self.hang()
        return JSONResponse({"ok": True, "duplicate": existing is not None})

    async def _list(self, request: Request) -> Response:
        with self.lock:
            return JSONResponse(
                {
                    "deliveries": [r.to_json() for r in self._received.values()],
                    "duplicates": self.duplicates,
                    "rejected": list(self.rejected),
                }
            )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/hooks", self._receive, methods=["POST"]),
                Route("/hooks", self._list, methods=["GET"]),
                *self.control_routes(),
            ]
        )
