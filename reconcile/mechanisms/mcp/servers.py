"""Which MCP server a call goes to, and how to reach it: Streamable HTTP or stdio.

Servers are named in configuration (`STOPDESK_MECHANISMS["mcp"]["options"]["servers"]`; the
callers pass the mechanism's options in):

    "servers": {
        "git": {"command": "mcp-server-git", "args": [], "env": {}, "cwd": None,
                "tools": {"git_commit": {"status_check": {...}}, "git_status": {"idempotent": True}}},
        "research": {"url": "https://tools.example/mcp", "headers": {"X-Team": "ops"},
                     "bearer_token_env": "RESEARCH_MCP_TOKEN", "revision": "auto"},
    }

`revision` is "auto" (the default: the newest revision the server offers, 2026-07-28, falling
back to 2025-11-25 when the server refuses it), or one revision pinned: "2026-07-28" or
"2025-11-25". What was used is recorded on every item (`revision_facts`), with how a cancel
travels in that revision over that transport (`cancel_wire`).

`trusted` (default false) says the server's tool annotations are the operator's word, not only
the server's hints about itself (the MCP gateway records `annotations_trusted` from it). A tool
declared `idempotent` may be repeated without harm: the gateway's retry gate lets its repeats pass.

The agent side and the reconciler both reach a server through `open_client`, so the reconciler
can look at a stdio server (it starts its own process from the same configuration) or send the
configured headers. Headers, bearer tokens and a stdio server's environment are secrets: they are
never recorded (`ServerSpec.public()` is what the ledger gets) and never logged.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

HTTP = "streamable_http"
STDIO = "stdio"
SESSION_HEADER = "mcp-session-id"

MODERN = "2026-07-28"  # stateless: no handshake, no session; over HTTP a cancel closes the stream
LEGACY = "2025-11-25"  # initialize handshake, sessions, core tasks; a cancel is a notification
AUTO = "auto"
REVISION_CHOICES = (AUTO, MODERN, LEGACY)

# How a cancel travels, by (revision era, transport). Only one of these is a message the server
# answers nothing to; none of them is proof that the work stopped.
NOTIFICATION = "notifications/cancelled"
NOTIFICATION_WITH_ID = "notifications/cancelled with the request id"
STREAM_CLOSED = "response stream closed"
TASKS_CANCEL = "tasks/cancel, then tasks/get"
# 2026-07-28 moved tasks out of the core into this extension (declared per request, no session).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def with_task_capabilities(
    caps: types.ServerCapabilities, protocol_version: str | None, *, extension: bool = True
) -> types.ServerCapabilities:
    """A server's capabilities offering tasks the way the revision means it: the tasks extension
    in 2026-07-28 (when `extension`), core tasks (list, cancel, `tools/call`) in 2025-11-25."""
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        if extension:
            caps.extensions = {**(caps.extensions or {}), TASKS_EXTENSION: {}}
        return caps
    caps.tasks = types.ServerTasksCapability(
        list=types.TasksListCapability(),
        cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(
            tools=types.TasksToolsCapability(call=types.TasksCallCapability())
        ),
    )
    return caps


class TasksExtension(ClientExtension):
    """Declares the tasks extension in a 2026-07-28 request's capabilities: only then may the
    server answer a `tools/call` with a task. Only a connection that handles task answers uses it."""

    identifier = TASKS_EXTENSION


def is_modern(revision: str | None) -> bool:
    return revision == MODERN


def cancel_wire(revision: str | None, transport: str, *, task: bool = False) -> str:
    """How a call's cancel goes on the wire in this revision over this transport (a gateway
    cancels an upstream call the same way)."""
    if task:
        return TASKS_CANCEL
    if transport == STDIO:
        return NOTIFICATION
    return STREAM_CLOSED if is_modern(revision) else NOTIFICATION_WITH_ID


class ServerConfigError(ValueError):
    """A server named in a call or in configuration cannot be used as written."""


@dataclass(frozen=True)
class StatusCheck:
    """A read-only tool on the same server that shows whether a call took effect.

    `arguments` and `completed_if_contains` may name the call's own arguments as `{name}`; they
    are filled in when the call is recorded, so the reconciler needs nothing but the item."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    completed_if_contains: str = ""

    def resolved(self, call_arguments: dict[str, Any]) -> dict[str, Any]:
        def fill(value: Any) -> Any:
            if isinstance(value, str):
                try:
                    return value.format_map(_Strict(call_arguments))
                except (KeyError, ValueError, IndexError) as exc:
                    raise ServerConfigError(f"status check for {self.tool!r}: cannot fill {value!r}: {exc}") from exc
            return value

        return {
            "tool": self.tool,
            "arguments": {k: fill(v) for k, v in self.arguments.items()},
            "completed_if_contains": fill(self.completed_if_contains),
        }


class _Strict(dict[str, Any]):
    def __missing__(self, key: str) -> Any:
        raise KeyError(f"the call has no argument {key!r}")


@dataclass(frozen=True)
class ServerSpec:
    name: str
    transport: str
    url: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    cwd: str | None = None
    # Secrets: kept out of repr, of `public()` and of every log line.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    bearer_token: str = field(default="", repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)
    status_checks: dict[str, StatusCheck] = field(default_factory=dict)
    configured: bool = False
    revision: str = AUTO  # what to ask for: AUTO, MODERN or LEGACY
    trusted: bool = False  # its annotations are the operator's word, not only the server's hints
    idempotent_tools: frozenset[str] = frozenset()  # repeating one of these does no harm
    # Tools a gateway runs as tasks for a 2026-07-28 client that declares the tasks extension: that
    # revision lists no `taskSupport` (its server decides per call), so the operator says which.
    task_tools: frozenset[str] = frozenset()

    def public(self) -> dict[str, Any]:
        """What the ledger may record about the server: where it is, never how we authenticate."""
        facts: dict[str, Any] = {"server": self.name, "transport": self.transport, "configured": self.configured}
        if self.transport == HTTP:
            facts["url"] = self.url
        else:
            facts["command"] = os.path.basename(self.command)
        return facts

    def http_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers

    def secrets(self) -> list[str]:
        """Every secret value, for tests and redaction."""
        values = [*self.headers.values(), *self.env.values()]
        if self.bearer_token:
            values.append(self.bearer_token)
        return [v for v in values if v]


def configured_servers(options: dict[str, Any]) -> dict[str, ServerSpec]:
    """The servers named in the MCP mechanism's options."""
    servers = options.get("servers") or {}
    if not isinstance(servers, dict):
        raise ServerConfigError("mcp options 'servers' must be a mapping of name to server")
    return {name: _spec(name, raw) for name, raw in servers.items()}


def _spec(name: str, raw: Any) -> ServerSpec:
    if not isinstance(raw, dict):
        raise ServerConfigError(f"mcp server {name!r}: expected a mapping")
    unknown = set(raw) - {
        "url",
        "headers",
        "bearer_token",
        "bearer_token_env",
        "command",
        "args",
        "env",
        "cwd",
        "tools",
        "revision",
        "trusted",
    }
    if unknown:
        raise ServerConfigError(f"mcp server {name!r}: unknown setting(s) {sorted(unknown)}")
    if bool(raw.get("url")) == bool(raw.get("command")):
        raise ServerConfigError(
            f"mcp server {name!r}: give exactly one of 'url' (Streamable HTTP) or 'command' (stdio)"
        )
    token = str(raw.get("bearer_token") or "")
    if raw.get("bearer_token_env"):
        token = os.environ.get(str(raw["bearer_token_env"]), "")
        if not token:
            raise ServerConfigError(f"mcp server {name!r}: environment variable {raw['bearer_token_env']} is not set")
    revision = str(raw.get("revision") or AUTO)
    if revision not in REVISION_CHOICES:
        raise ServerConfigError(
            f"mcp server {name!r}: 'revision' must be one of {list(REVISION_CHOICES)}, not {revision!r}"
        )
    trusted = raw.get("trusted", False)
    if not isinstance(trusted, bool):
        raise ServerConfigError(f"mcp server {name!r}: 'trusted' must be true or false, not {trusted!r}")
    checks: dict[str, StatusCheck] = {}
    idempotent: set[str] = set()
    task_tools: set[str] = set()
    for tool, declared in (raw.get("tools") or {}).items():
        for setting, chosen in (("idempotent", idempotent), ("task", task_tools)):
            flag = (declared or {}).get(setting, False)
            if not isinstance(flag, bool):
                raise ServerConfigError(
                    f"mcp server {name!r}, tool {tool!r}: {setting!r} must be true or false, not {flag!r}"
                )
            if flag:
                chosen.add(tool)
        check = (declared or {}).get("status_check")
        if check is None:
            continue
        if not isinstance(check, dict) or not check.get("tool"):
            raise ServerConfigError(f"mcp server {name!r}, tool {tool!r}: a status check needs a 'tool'")
        checks[tool] = StatusCheck(
            tool=str(check["tool"]),
            arguments=dict(check.get("arguments") or {}),
            completed_if_contains=str(check.get("completed_if_contains") or ""),
        )
    return ServerSpec(
        name=name,
        transport=HTTP if raw.get("url") else STDIO,
        url=str(raw.get("url") or ""),
        command=str(raw.get("command") or ""),
        args=tuple(str(a) for a in raw.get("args") or ()),
        cwd=raw.get("cwd"),
        headers={str(k): str(v) for k, v in (raw.get("headers") or {}).items()},
        bearer_token=token,
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        status_checks=checks,
        configured=True,
        revision=revision,
        trusted=trusted,
        idempotent_tools=frozenset(idempotent),
        task_tools=frozenset(task_tools),
    )


def resolve(server: str | StdioServerParameters | ServerSpec, options: dict[str, Any]) -> ServerSpec:
    """A configured name, a URL (configured or not), or stdio parameters given in code."""
    if isinstance(server, ServerSpec):
        return server
    if isinstance(server, StdioServerParameters):
        return ServerSpec(
            name=os.path.basename(server.command),
            transport=STDIO,
            command=server.command,
            args=tuple(server.args),
            cwd=str(server.cwd) if server.cwd is not None else None,
            env=dict(server.env or {}),
        )
    configured = configured_servers(options)
    if server in configured:
        return configured[server]
    if server.startswith(("http://", "https://")):
        for spec in configured.values():
            if spec.url == server:
                return spec
        return ServerSpec(name=server, transport=HTTP, url=server)
    raise ServerConfigError(f"no MCP server named {server!r} is configured, and it is not a URL")


def from_detail(facts: dict[str, Any], options: dict[str, Any]) -> ServerSpec:
    """The configured server an item's recorded facts name. The reconciler reaches only configured
    servers: a URL or a command recorded on an item is where the agent side went, and is never
    dialled or run from the ledger (a runtime could otherwise point the server, with the
    configured headers, anywhere)."""
    name = str(facts.get("server") or "")
    configured = configured_servers(options)
    if name in configured:
        return configured[name]
    # Called by its URL, and that URL is a configured server's: the configured entry (its URL,
    # its headers) is what is used.
    for spec in configured.values():
        if spec.transport == HTTP and spec.url and spec.url in (name, str(facts.get("url") or "")):
            return spec
    raise ServerConfigError(
        f"the MCP server {name!r} is not configured, so the server cannot reach it to look "
        "(only configured servers are reached from the ledger)"
    )


def _errlog() -> TextIO:
    # The subprocess needs a real file descriptor; under a test runner sys.stderr may not have one.
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w")  # lives as long as the process


@dataclass
class Connection:
    """An open client plus what the transport told us (the HTTP session id, the server process)
    and what was asked for (`requested`: AUTO or one revision)."""

    client: Client
    spec: ServerSpec
    requested: str = AUTO
    session_id: str | None = None
    chosen_because: str = ""  # why an older revision was chosen over one the server offered
    # The JSON-RPC id of the last request sent per method (both transports): the upstream's id of a
    # call, which its cancel names, for the record.
    sent_ids: dict[str, Any] = field(default_factory=dict)
    # Who hears the server's notifications (a call's progress watcher), and its tool list as last
    # listed: a connection kept across calls (the gateway's) asks for it once, and again only
    # after the server says its tools changed.
    listeners: set[Callable[..., Any]] = field(default_factory=set)
    tools: types.ListToolsResult | None = None

    async def hear(self, message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            self.tools = None
        for listener in list(self.listeners):
            await listener(message)

    async def list_tools(self) -> types.ListToolsResult:
        if self.tools is None:
            self.tools = await self.client.list_tools()
        return self.tools

    @property
    def revision(self) -> str:
        return self.client.protocol_version

    def revision_facts(self) -> dict[str, Any]:
        """The revision and transport actually used, how they were chosen, and how a cancel goes."""
        revision = self.revision
        if self.chosen_because:
            how = self.chosen_because
        elif self.requested != AUTO:
            how = f"{self.requested} pinned by configuration"
        elif is_modern(revision):
            how = f"negotiated: the server offered {MODERN}"
        else:
            how = f"fell back: the server refused {MODERN}, so {revision} was negotiated by handshake"
        return {
            "revision": revision,
            "protocol_version": revision,
            "transport": self.spec.transport,
            "negotiation": how,
            "cancel_wire": cancel_wire(revision, self.spec.transport),
        }


@asynccontextmanager
async def open_client(
    spec: ServerSpec,
    *,
    timeout_s: float,
    message_handler: Callable[..., Any] | None = None,
    terminate_on_close: bool = True,
    revision: str | None = None,
    extensions: Sequence[ClientExtension] | None = None,
    keepalive_s: float = 5.0,
) -> AsyncIterator[Connection]:
    """Connect in `revision` (default: the server's configured one, normally AUTO: the newest
    the server offers, 2025-11-25 when it refuses 2026-07-28; the SDK's `mode="auto"` probes
    `server/discover` and falls back to `initialize` on any refusal). Over HTTP, an idle connection
    is kept `keepalive_s` for the next request (httpx's default; a connection kept across calls
    wants less than the server's own keep-alive, see `stopdesk.gateway.upstreams.KEEPALIVE_S`)."""
    requested = revision or spec.revision
    conn_box: list[Connection] = []

    async def remember_session(response: httpx2.Response) -> None:
        sid = response.headers.get(SESSION_HEADER)
        if sid and conn_box:
            conn_box[0].session_id = sid

    async def hear(message: Any) -> None:
        if conn_box:
            await conn_box[0].hear(message)

    async def remember_request_id(request: httpx2.Request) -> None:
        if conn_box and request.method == "POST":
            _note_request_id(conn_box[0], request)

    transport: Any
    http: httpx2.AsyncClient | None = None
    if spec.transport == HTTP:
        http = httpx2.AsyncClient(
            headers=spec.http_headers(),
            timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
            # httpx's own limits, but for how long an idle connection is kept (`keepalive_s`).
            limits=httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=keepalive_s),
            event_hooks={"request": [remember_request_id], "response": [remember_session]},
        )
        transport = streamable_http_client(spec.url, http_client=http, terminate_on_close=terminate_on_close)
    else:
        command = shutil.which(spec.command) or spec.command
        params = StdioServerParameters(command=command, args=list(spec.args), env=spec.env or None, cwd=spec.cwd)
        transport = _noting_sent_ids(stdio_client(params, errlog=_errlog()), conn_box)
    mode = "legacy" if requested == LEGACY else requested
    client = Client(transport, mode=mode, read_timeout_seconds=timeout_s, message_handler=hear, extensions=extensions)
    conn = Connection(client=client, spec=spec, requested=requested)
    if message_handler is not None:
        conn.listeners.add(message_handler)
    conn_box.append(conn)
    try:
        async with client:
            yield conn
    finally:
        if http is not None:
            await http.aclose()


@asynccontextmanager
async def _noting_sent_ids(transport: Any, conn_box: list[Connection]) -> AsyncIterator[tuple[Any, Any]]:
    """A stdio transport whose writes note each request's id, as the HTTP hook does for a POST."""
    async with transport as (read, write):
        yield read, _NotingWrites(write, conn_box)


class _NotingWrites:
    """The stdio client's write stream, noting the id of every request on its way out."""

    def __init__(self, stream: Any, conn_box: list[Connection]) -> None:
        self._stream = stream
        self._conn_box = conn_box

    async def send(self, item: Any) -> None:
        message = getattr(item, "message", item)
        message = getattr(message, "root", message)
        method, request_id = getattr(message, "method", None), getattr(message, "id", None)
        if self._conn_box and isinstance(method, str) and request_id is not None:
            self._conn_box[0].sent_ids[method] = request_id
        await self._stream.send(item)

    async def __aenter__(self) -> _NotingWrites:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._stream.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _note_request_id(conn: Connection, request: httpx2.Request) -> None:
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return  # a body we do not read (streamed) or not JSON: nothing to note
    if isinstance(message, dict) and "id" in message and isinstance(message.get("method"), str):
        conn.sent_ids[message["method"]] = message["id"]
