"""The OpenAI stand-in's webhooks: `response.*` events sent to one URL the way OpenAI sends them.

- signed with Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`: HMAC-SHA256
  over `id.timestamp.body` with the endpoint's `whsec_` secret), each attempt with a fresh timestamp;
- the body names the response only: `{"id": "evt_...", "object": "event", "type":
  "response.completed", "created_at": ..., "data": {"id": "resp_..."}}`;
- at least once: a delivery that gets no 2xx is tried again with backoff (here a few times,
  seconds apart; OpenAI keeps trying for days), and some deliveries are sent twice
  (`duplicate_rate`) with the same webhook-id;
- in no particular order: each send waits a random part of `jitter_s`, so a response's
  `response.cancelled` can arrive after its `response.completed`, and events of different responses
  arrive in any order.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from standardwebhooks.webhooks import Webhook

EVENT_TYPES = {
    "completed": "response.completed",
    "cancelled": "response.cancelled",
    "failed": "response.failed",
    "incomplete": "response.incomplete",
}


@dataclass(frozen=True)
class Sent:
    """One attempt, for tests and the bench: what was sent and what came back."""

    webhook_id: str
    event_type: str
    response_id: str
    attempt: int
    status: int | None  # None: no answer (connection refused, timeout)
    at: float  # time.time() when the answer came


class WebhookSender:
    """Delivers events to `url` from a scheduler thread and a few sending threads."""

    def __init__(
        self,
        *,
        url: str,
        secret: str,
        duplicate_rate: float = 0.0,
        jitter_s: float = 0.0,
        retry_initial_s: float = 0.5,
        attempts: int = 6,
        seed: int | None = None,
    ) -> None:
        self.url = url
        self._signer = Webhook(secret)
        self.duplicate_rate = duplicate_rate
        self.jitter_s = jitter_s
        self.retry_initial_s = retry_initial_s
        self.attempts = attempts
        self._random = random.Random(seed)
        self._http = httpx.Client(timeout=5.0, trust_env=False)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="openai-webhook")
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self.sent: list[Sent] = []
        self._thread = threading.Thread(target=self._run, name="openai-webhooks", daemon=True)
        self._thread.start()

    def event(self, status: str, response_id: str) -> None:
        """Send the event for a response that reached `status` (a terminal one)."""
        event_type = EVENT_TYPES[status]
        webhook_id = f"wh_{uuid.uuid4().hex}"
        body = json.dumps(
            {
                "id": f"evt_{uuid.uuid4().hex}",
                "object": "event",
                "type": event_type,
                "created_at": int(time.time()),
                "data": {"id": response_id},
            }
        )
        copies = 2 if self._random.random() < self.duplicate_rate else 1
        for _ in range(copies):
            self._later(self._random.random() * self.jitter_s, webhook_id, event_type, response_id, body, 1)

    def _later(self, delay: float, webhook_id: str, event_type: str, response_id: str, body: str, n: int) -> None:
        def send() -> None:
            self._pool.submit(self._send, webhook_id, event_type, response_id, body, n)

        with self._wake:
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._order), send))
            self._wake.notify()

    def _send(self, webhook_id: str, event_type: str, response_id: str, body: str, n: int) -> None:
        now = datetime.now(tz=UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(webhook_id, now, body),
            "user-agent": "OpenAI/1.0 (+https://platform.openai.com/docs/webhooks)",
        }
        status: int | None
        try:
            status = self._http.post(self.url, content=body, headers=headers).status_code
        except httpx.HTTPError:
            status = None
        with self._wake:
            self.sent.append(Sent(webhook_id, event_type, response_id, n, status, time.time()))
        if (status is None or not 200 <= status < 300) and n < self.attempts and not self._closed:
            self._later(self.retry_initial_s * 2 ** (n - 1), webhook_id, event_type, response_id, body, n + 1)

    def pending(self) -> int:
        with self._wake:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (not self._queue or self._queue[0][0] > time.monotonic()):
                    self._wake.wait(None if not self._queue else max(0.0, self._queue[0][0] - time.monotonic()))
                if self._closed:
                    return
                _, _, send = heapq.heappop(self._queue)
            send()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=2)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
