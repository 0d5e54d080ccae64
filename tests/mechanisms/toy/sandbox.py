"""The toy's outside service: jobs that run for a while unless cancelled, on 127.0.0.1."""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stopdrill.sandbox.common import SandboxParty


class ToyJobsServer(SandboxParty):
    def __init__(self, *, run_s: float = 3.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_s = run_s
        self.jobs: dict[str, dict[str, Any]] = {}

    def _status(self, key: str) -> str:
        job = self.jobs[key]
        if job["status"] == "running" and time.monotonic() - job["at"] >= self.run_s:
            job["status"] = "completed"
        return str(job["status"])

    def app(self) -> Starlette:
        async def create(request: Request) -> JSONResponse:
            key = request.headers["Idempotency-Key"]
            with self.lock:
                self.jobs.setdefault(key, {"status": "running", "at": time.monotonic()})
                return JSONResponse({"status": self._status(key)}, status_code=201)

        async def read(request: Request) -> JSONResponse:
            key = request.path_params["key"]
            with self.lock:
                if key not in self.jobs:
                    return JSONResponse({"error": "not found"}, status_code=404)
                return JSONResponse({"status": self._status(key)})

        async def cancel(request: Request) -> JSONResponse:
            key = request.path_params["key"]
            with self.lock:
                if key not in self.jobs:
                    return JSONResponse({"error": "not found"}, status_code=404)
                if self._status(key) == "running":
                    self.jobs[key]["status"] = "cancelled"
                return JSONResponse({"status": self._status(key)})

        return Starlette(
            routes=[
                Route("/jobs", create, methods=["POST"]),
                Route("/jobs/{key}", read, methods=["GET"]),
                Route("/jobs/{key}/cancel", cancel, methods=["POST"]),
            ]
        )

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.jobs.clear()


PARTY = ToyJobsServer
PARTY_NAME = "toy"
URL_SUFFIX = ""
ACTIONS = [("POST", re.compile(r"^/jobs$"))]
DRILL_OPTIONS: dict[str, float] = {}
