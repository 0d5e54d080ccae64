"""The sandbox for drills: the four parties behind an arrival log.

The parties count requests; a drill also needs *when* each action reached the external system, to
compare with the task's stop_requested_at. `ArrivalLog` is ASGI middleware in front of each
party's app that timestamps every request on arrival (before the party's latency or faults) and
keeps what identifies its work item: the Idempotency-Key header, or the `stopdesk_item` metadata
of an OpenAI create, or the tool name of an MCP tools/call.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reconcile.mechanisms import registry
from stopdrill.sandbox.common import SandboxParty
from stopdrill.sandbox.outbox import Outbox
from stopdrill.sandbox.server import BackgroundServer, Sandbox, mechanism_parties

# (party, method, path) patterns that are actions, i.e. work that must pass the boundary first.
# Reads, lookups and cancels are what Stop itself sends afterwards and are not actions.
# A mechanism folder's sandbox part says its own (`ACTIONS`); these are the shared parties'.
_SHARED_ACTIONS: dict[str, list[tuple[str, re.Pattern[str]]]] = {
    "outbox": [("POST", re.compile(r"^/messages$"))],
}


def _actions(party: str) -> list[tuple[str, re.Pattern[str]]]:
    own = mechanism_parties().get(party)
    return list(own.ACTIONS) if own is not None else _SHARED_ACTIONS.get(party, [])


@dataclass(frozen=True)
class Arrival:
    at: float  # time.time() when the request reached the party
    party: str
    method: str
    path: str
    key: str = ""  # Idempotency-Key header
    item: str = ""  # the work item named in the request body (OpenAI metadata), if any
    tool: str = ""  # MCP tools/call name
    action: bool = False

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


class ArrivalLog:
    """Every request that reached a party, in arrival order. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []

    def record(self, arrival: Arrival) -> None:
        with self._lock:
            self._arrivals.append(arrival)

    def arrivals(self, *, actions_only: bool = False) -> list[Arrival]:
        with self._lock:
            return [a for a in self._arrivals if a.action or not actions_only]

    def clear(self) -> None:
        with self._lock:
            self._arrivals.clear()

    def wrap(self, party: str, app: Any) -> Callable[..., Any]:
        """ASGI middleware recording each HTTP request to `party` before `app` sees it."""
        patterns = _actions(party)

        async def middleware(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            if scope["type"] != "http" or scope["path"].startswith("/_control"):
                await app(scope, receive, send)
                return
            at = time.time()
            method, path = scope["method"], scope["path"]
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            action = any(method == m and p.match(path) for m, p in patterns)
            if not action:
                self.record(Arrival(at, party, method, path, key=headers.get("idempotency-key", "")))
                await app(scope, receive, send)
                return
            # Read the body here and replay it: the item id or the MCP method is inside.
            chunks: list[bytes] = []
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            item, tool, is_action = _identify(party, body)
            self.record(
                Arrival(
                    at,
                    party,
                    method,
                    path,
                    key=headers.get("idempotency-key", ""),
                    item=item,
                    tool=tool,
                    action=is_action,
                )
            )
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await app(scope, replay, send)

        return middleware


def _identify(party: str, body: bytes) -> tuple[str, str, bool]:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return "", "", party != "mcp"
    if party == "openai" and isinstance(data, dict):
        # A background response runs on its own after the call returns: an action to account for.
        # A foreground request (a framework agent's turn) only answers its caller: a draft.
        return str((data.get("metadata") or {}).get("stopdesk_item", "")), "", bool(data.get("background"))
    if party == "mcp":
        # Only a tools/call is an action; initialize, list, tasks/* and notifications are not.
        if isinstance(data, dict) and data.get("method") == "tools/call":
            params = data.get("params") or {}
            meta = params.get("_meta") or {}
            return str(meta.get("stopdesk_item", "")), str(params.get("name", "")), True
        return "", "", False
    return "", "", True


@dataclass
class DrillSandbox:
    sandbox: Sandbox
    log: ArrivalLog
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def urls(self) -> dict[str, str]:
        return self.sandbox.urls

    def system(self, name: str) -> str:
        """The name the ledger records effects under. A reset party numbers its records from 1
        again ("crm-1"), and (system, record id) is unique in the ledger, so each reset gets a
        system name of its own instead of colliding with an earlier drill's record. The name is
        configured (at this sandbox's party), as the server reaches only configured systems."""
        system = f"{name}~{self.epoch}"
        if name in self.urls:
            configure_system(system, like=name, base_url=self.urls[name])
        return system

    def endpoints(self) -> dict[str, dict[str, Any]]:
        """The sandbox's OpenAI stand-in and MCP server as the mechanisms' configured endpoints
        (settings overrides for the drills): the reconciler reaches only configured ones."""
        from django.conf import settings

        mcp = dict(getattr(settings, "STOPDESK_MECHANISMS", {}).get("mcp", {}).get("options", {}))
        mcp["servers"] = {**mcp.get("servers", {}), "drill-sandbox": {"url": self.urls["mcp"]}}
        return {
            "openai": {"options": {"base_url": self.urls["openai"], "api_key": "sandbox"}},
            "mcp": {"options": mcp},
        }

    def reset(self) -> None:
        self.sandbox.reset()
        self.log.clear()
        self.epoch = uuid.uuid4().hex[:8]

    def stop(self) -> None:
        self.sandbox.stop()


def start_drill_sandbox() -> DrillSandbox:
    """Start the four parties, each behind the arrival log, on free loopback ports."""
    log = ArrivalLog()
    own = mechanism_parties()
    parties: dict[str, SandboxParty] = {name: part.PARTY(**part.DRILL_OPTIONS) for name, part in own.items()}
    parties["outbox"] = Outbox()
    servers: dict[str, BackgroundServer] = {}
    try:
        for name, party in parties.items():
            factory = _wrapped_factory(log, name, party.app)
            servers[name] = BackgroundServer(factory, name=f"drill-{name}").start()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    sandbox = Sandbox(parties=parties, servers=servers, suffixes={name: part.URL_SUFFIX for name, part in own.items()})
    return DrillSandbox(sandbox, log)


def _wrapped_factory(log: ArrivalLog, name: str, factory: Callable[[], Any]) -> Callable[[], Any]:
    def build() -> Any:
        return log.wrap(name, factory())

    return build


def configure_system(system: str, *, like: str, base_url: str) -> None:
    """Configure `system` as the settings' `like` system at `base_url` (a drill's sandbox party,
    or the CRM given to `stopdrill --crm-url`), as an operator would in STOPDESK_MECHANISMS."""
    from django.conf import settings

    systems = settings.STOPDESK_MECHANISMS.setdefault("http", {}).setdefault("options", {}).setdefault("systems", {})
    wanted = {**systems.get(like, {}), "base_url": base_url.rstrip("/")}
    if systems.get(system) != wanted:
        systems[system] = wanted
        registry.reset()
