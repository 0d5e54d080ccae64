"""What every sandbox party shares: honest request counts, latency, faults, control routes.

A party's state is touched from two threads: the server thread (requests) and the test or
demo thread (the Python control API). One `threading.Lock` per party guards all of it;
handlers never await while holding it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

# Long enough that no sane client timeout outlives it; the server's graceful-shutdown
# timeout cancels it on stop().
HANG_SECONDS = 3600.0


class RequestCounts:
    """How many requests reached the server, per endpoint and per object key.

    Counted on arrival, before latency or faults, so a request the client gave up on
    (and retried) is still counted: the point is to be honest about what was received.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_endpoint: Counter[str] = Counter()
        self._by_key: dict[str, Counter[str]] = {}

    def record(self, endpoint: str, key: str | None = None) -> None:
        with self._lock:
            self._by_endpoint[endpoint] += 1
            if key is not None:
                self._by_key.setdefault(key, Counter())[endpoint] += 1

    def count(self, endpoint: str, key: str | None = None) -> int:
        with self._lock:
            if key is None:
                return self._by_endpoint[endpoint]
            return self._by_key.get(key, Counter())[endpoint]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "endpoints": dict(self._by_endpoint),
                "by_key": {key: dict(counts) for key, counts in self._by_key.items()},
            }

    def reset(self) -> None:
        with self._lock:
            self._by_endpoint.clear()
            self._by_key.clear()


class FaultError(ValueError):
    """An unknown fault or config name: a typo in a drill should fail loudly."""


class SandboxParty:
    """Base for a stand-in external party: config, faults, counts and `/_control` routes.

    Faults are names from `FAULTS`. A global fault applies to every object; a targeted
    fault (`target=` an object id or idempotency key) applies to that one only. Both are
    read when a request is served, so turning a fault on affects objects that already
    exist, like a real outage would.
    """

    FAULTS: ClassVar[frozenset[str]] = frozenset()
    # Attributes that `configure()` and `POST /_control/config` may change.
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = ("latency_s",)

    def __init__(self, *, latency_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.counts = RequestCounts()
        self.latency_s = latency_s
        self._global_faults: set[str] = set()
        self._targeted_faults: dict[str, set[str]] = {}

    def app(self) -> Starlette:
        """A fresh ASGI app over this party's state; called on every server start."""
        raise NotImplementedError

    # --- configuration -------------------------------------------------------------

    def configure(self, **changes: Any) -> dict[str, Any]:
        unknown = set(changes) - set(self.CONFIG_FIELDS)
        if unknown:
            raise FaultError(f"unknown config field(s): {sorted(unknown)}")
        with self.lock:
            for name, value in changes.items():
                current = getattr(self, name)
                if isinstance(current, float) and isinstance(value, int):
                    value = float(value)
                setattr(self, name, value)
        return self.config()

    def config(self) -> dict[str, Any]:
        with self.lock:
            return {name: getattr(self, name) for name in self.CONFIG_FIELDS}

    # --- faults -------------------------------------------------------------------

    def check_fault(self, fault: str) -> None:
        if fault not in self.FAULTS:
            raise FaultError(f"unknown fault {fault!r}; known: {sorted(self.FAULTS)}")

    def set_fault(self, fault: str, *, target: str | None = None, enabled: bool = True) -> None:
        self.check_fault(fault)
        with self.lock:
            bucket = self._global_faults if target is None else self._targeted_faults.setdefault(target, set())
            if enabled:
                bucket.add(fault)
            else:
                bucket.discard(fault)

    def clear_faults(self, *, target: str | None = None) -> None:
        with self.lock:
            if target is None:
                self._global_faults.clear()
                self._targeted_faults.clear()
            else:
                self._targeted_faults.pop(target, None)

    def has_fault(self, fault: str, *targets: str | None) -> bool:
        with self.lock:
            return self._has_fault_locked(fault, targets)

    def _has_fault_locked(self, fault: str, targets: Iterable[str | None]) -> bool:
        if fault in self._global_faults:
            return True
        return any(t is not None and fault in self._targeted_faults.get(t, ()) for t in targets)

    def faults(self) -> dict[str, Any]:
        with self.lock:
            return {
                "global": sorted(self._global_faults),
                "targeted": {t: sorted(f) for t, f in self._targeted_faults.items() if f},
            }

    # --- request plumbing -----------------------------------------------------------

    async def arrive(self, endpoint: str, key: str | None = None) -> None:
        """Count the request, then pay the configured latency."""
        self.counts.record(endpoint, key)
        with self.lock:
            latency = self.latency_s
        if latency > 0:
            await anyio.sleep(latency)

    @staticmethod
    async def hang() -> None:
        await anyio.sleep(HANG_SECONDS)

    def stats(self) -> dict[str, Any]:
        return self.counts.snapshot()

    def reset(self) -> None:
        """Forget objects, faults and counts; keep config. Subclasses extend."""
        self.counts.reset()
        self.clear_faults()

    # --- HTTP control surface ---------------------------------------------------------

    def control_routes(self) -> list[Route]:
        """`/_control/*`: the same controls over HTTP, for drills steering another process."""

        async def stats(request: Request) -> JSONResponse:
            return JSONResponse(self.stats())

        async def config(request: Request) -> JSONResponse:
            if request.method == "POST":
                try:
                    return JSONResponse(self.configure(**await request.json()))
                except FaultError as exc:
                    return JSONResponse({"error": str(exc)}, status_code=400)
            return JSONResponse(self.config())

        async def faults(request: Request) -> JSONResponse:
            if request.method == "POST":
                body = await request.json()
                try:
                    if body.get("clear"):
                        self.clear_faults(target=body.get("target"))
                    else:
                        self.set_fault(body["fault"], target=body.get("target"), enabled=body.get("enabled", True))
                except (FaultError, KeyError) as exc:
                    return JSONResponse({"error": str(exc)}, status_code=400)
            return JSONResponse(self.faults())

        async def reset(request: Request) -> JSONResponse:
            self.reset()
            return JSONResponse({"reset": True})

        return [
            Route("/_control/stats", stats, methods=["GET"]),
            Route("/_control/config", config, methods=["GET", "POST"]),
            Route("/_control/faults", faults, methods=["GET", "POST"]),
            Route("/_control/reset", reset, methods=["POST"]),
        ]
