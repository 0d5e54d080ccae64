"""The gateway as one ASGI app: `/mcp/<name>` for every configured MCP server (each served by an
`UpstreamGateway` of `server`), and `/healthz`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from reconcile.mechanisms.mcp.servers import configured_servers
from reconcile.mechanisms.registry import mechanism_settings
from stopdesk.agent.aio import LedgerThreads
from stopdesk.gateway.fast_calls import FastCalls
from stopdesk.gateway.ledger_pool import LedgerPool
from stopdesk.gateway.server import LEDGER_THREADS, PATH, UpstreamGateway
from stopdesk.gateway.sessions import SessionTasks
from stopdesk.gateway.settling import QUIET_S, SettleChecks


def gateway_app(
    *, host: str = "127.0.0.1", poll_s: float = 5.0, timeout_s: float = 300.0, settle_quiet_s: float = QUIET_S
) -> Starlette:
    """One Starlette app: `/mcp/<name>` for every configured MCP server, one session manager each.
    Stop reaches a call through the process's StopHub at once; `poll_s` paces each call's lease
    (and is the longest a Stop waits should the hub's notification be lost). A session's task is
    checked for settling once its calls have been quiet `settle_quiet_s` (`settling.py`)."""
    tasks = SessionTasks()
    ledger = LedgerThreads(LEDGER_THREADS)
    pool = LedgerPool(LEDGER_THREADS)  # the forwarded calls' two statements, on the loop
    specs = configured_servers(mechanism_settings("mcp").options)
    routes: list[BaseRoute] = []
    managers = []
    gateways = []
    for name, spec in sorted(specs.items()):
        gateway = UpstreamGateway(
            spec, tasks, ledger, poll_s=poll_s, timeout_s=timeout_s, settle_checks=SettleChecks(ledger, settle_quiet_s)
        )
        server = gateway.build_server()
        path = PATH.format(name=name)
        app = server.streamable_http_app(streamable_http_path=path, host=host)
        security = server.session_manager.security_settings
        for route in app.routes:
            if isinstance(route, Route) and route.path == path:  # 2026-07-28 calls first (`fast_calls.py`)
                route = Route(path, endpoint=FastCalls(gateway, route.app, security, pool))
            routes.append(route)
        managers.append(server.session_manager)
        gateways.append(gateway)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            stack.callback(ledger.close)  # last: the calls below may still write as they end
            await stack.enter_async_context(pool.running())
            for gateway in gateways:
                await stack.enter_async_context(gateway.running())
            for manager in managers:
                await stack.enter_async_context(manager.run())
            yield

    async def healthz(request: Request) -> JSONResponse:
        # How each server's calls went: forwarded as they came, or through the SDK (`fast_calls.py`).
        calls = {g.spec.name: {"forwarded": g.calls["forwarded"], "sdk": g.calls["sdk"]} for g in gateways}
        return JSONResponse({"ok": True, "servers": sorted(specs), "calls": calls})

    return Starlette(routes=[Route("/healthz", healthz, methods=["GET"]), *routes], lifespan=lifespan)
