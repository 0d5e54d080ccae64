"""The MCP Stop gateway for one client over stdio (entry point: `shim.py`, `stopdesk-mcp`).

The shim starts the server itself, through the same `UpstreamGateway` as `/mcp/<name>`, and
serves the client on its own stdin and stdout: every `tools/call` is an item that passes the
boundary before it is forwarded, and Stop cancels it upstream with `notifications/cancelled`.

One shim process is one client session and one stopdesk task: the one `--task` names, or one
opened at the first call, named after the client's `clientInfo` and the server. After Stop every
call is refused until the client starts the shim again (a new session, a new task).

The server's name is `--name` or the command's file name. A server of that name in the
configuration file is used as configured (its status checks, its environment), and refused when
the command line runs another command: the reconciler, which looks only at configured servers,
would look at the wrong one. The server gets the client's environment (where a client's config
puts a server's token), except for stopdesk's own settings: the database's address and password
are not the server's business."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace

from mcp.server.stdio import stdio_server

from reconcile.mechanisms.mcp.servers import STDIO, ServerSpec
from stopdesk.agent.aio import LedgerThreads
from stopdesk.gateway.server import UpstreamGateway
from stopdesk.gateway.sessions import ACTOR, Caller, SessionTasks
from stopdesk.gateway.settling import SettleChecks
from stopdesk.models import Task
from stopdesk.services.items import task_create

# Variables that configure stopdesk, never passed on to the server it starts.
OWN_VARIABLES = ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")
# One client: a couple of threads are enough for its ledger calls (a call and its cancel at once).
LEDGER_THREADS = 2


class ShimRefused(ValueError):
    """The command line names a server the shim will not start."""


def passed_environment(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in OWN_VARIABLES and not k.startswith("STOPDESK_")}


def server_spec(
    *, name: str | None, command: tuple[str, ...], configured: dict[str, ServerSpec], environ: dict[str, str]
) -> ServerSpec:
    """The server to start: the configured one of that name, or the command line as given."""
    name = name or os.path.basename(command[0])
    env = passed_environment(environ)
    spec = configured.get(name)
    if spec is not None:
        if command and not _same_command(spec, command):
            raise ShimRefused(
                f"the MCP server {name!r} is configured with another command; "
                f"run `stopdesk-mcp --name {name}` alone, or give this one another --name"
            )
        return replace(spec, env={**env, **spec.env}) if spec.transport == STDIO else spec
    if not command:
        raise ShimRefused(f"no MCP server named {name!r} is configured; give its command after --")
    return ServerSpec(name=name, transport=STDIO, command=command[0], args=command[1:], env=env)


def _same_command(spec: ServerSpec, command: tuple[str, ...]) -> bool:
    def program(path: str) -> str:
        return shutil.which(path) or path

    return bool(spec.command) and (program(spec.command), spec.args) == (program(command[0]), command[1:])


def task_exists(task_id: int) -> bool:
    return Task.objects.filter(pk=task_id).exists()


class OneTask(SessionTasks):
    """Every call of the shim's one client session goes to one task."""

    def __init__(self, task_id: int | None = None) -> None:
        super().__init__()
        self.task_id = task_id
        self._lock = threading.Lock()

    def task_for(self, caller: Caller) -> int:
        with self._lock:  # the client's first calls may arrive together
            if self.task_id is None:
                self.task_id = task_create(title=caller.title(), actor=ACTOR).pk
            return self.task_id

    def forget(self, caller: Caller) -> bool:
        return False  # the shim's one task: once closed, its calls are refused


async def serve(spec: ServerSpec, tasks: OneTask, *, poll_s: float = 5.0, timeout_s: float = 300.0) -> None:
    """Serve one client on this process's stdin and stdout until it closes stdin. `stdio_server()`
    points fd 1 at stderr while it serves, so nothing printed by stopdesk or a library reaches
    the wire; the server the shim starts has pipes of its own."""
    ledger = LedgerThreads(LEDGER_THREADS)
    try:
        gateway = UpstreamGateway(
            spec, tasks, ledger, poll_s=poll_s, timeout_s=timeout_s, settle_checks=SettleChecks(ledger)
        )
        server = gateway.build_server()
        async with gateway.running(), stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        ledger.close()  # last: a call may still write as the session ends
