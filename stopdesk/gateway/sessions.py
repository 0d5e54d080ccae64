"""Which stopdesk task a gateway session's calls belong to, and what a stopped client is told.

A client names an existing task with the `X-Stopdesk-Task` header (so a framework run and its MCP
calls share one task), or a call names one in its `_meta` (`io.stopdesk/task`, for clients that
cannot set headers; the call's own word wins over the header). Otherwise the gateway opens one
task per client session: per
`Mcp-Session-Id` in 2025-11-25; in 2026-07-28, which has no sessions, per client (`clientInfo`
name and version) and upstream. The task is named after both. Which task a session has is kept in
the database (`GatewaySession`), so every gateway process behind a load balancer files a
2026-07-28 client's calls under the same task, and a restart changes nothing; the session keeps
its task until the task is closed (by its idle timeout), then its next call opens a new one."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stopdesk.models import StopRequest
from stopdesk.services.gateway_sessions import gateway_session_task

TASK_HEADER = "x-stopdesk-task"
TASK_META_KEY = "io.stopdesk/task"
ACTOR = "gateway:mcp"


class UnknownTask(LookupError):
    """The `X-Stopdesk-Task` header or the `io.stopdesk/task` key names no task."""


@dataclass(frozen=True)
class Caller:
    """Who is calling through the gateway, as the client said it."""

    client_name: str
    client_version: str
    upstream: str
    session_id: str | None = None
    task_header: str | None = None
    task_meta: Any = None  # the call's `_meta` `io.stopdesk/task`: a task id, as a number or a string

    def key(self) -> tuple[str, ...]:
        if self.session_id:
            return ("session", self.upstream, self.session_id)
        return ("client", self.upstream, self.client_name, self.client_version)

    def title(self) -> str:
        client = f"{self.client_name} {self.client_version}".strip() or "an MCP client"
        return f"MCP: {client} via {self.upstream}"


class SessionTasks:
    """The task of each gateway session. The ledger is the truth (`GatewaySession`), so that every
    process agrees; each process keeps what it read, since a session keeps its task until the
    task is closed: a registration in a closed task is refused (TaskClosed), and the caller then
    `forget`s it and reads the session's next task. A task a caller names is not read at all:
    registering in a task that is not there finds nothing (`unknown`)."""

    def __init__(self) -> None:
        self._known: dict[str, int] = {}

    def task_for(self, caller: Caller) -> int:
        if caller.task_meta is not None:
            return _named_task(caller.task_meta, TASK_META_KEY)
        if caller.task_header is not None:
            return _named_task(caller.task_header, TASK_HEADER)
        key = _session_key(caller)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = gateway_session_task(key=key, title=caller.title(), actor=ACTOR)
        return found

    def known(self, caller: Caller) -> int | None:
        """The caller's task if known without asking the ledger: one it names, or its session's as
        kept here; None otherwise (then `task_for`)."""
        try:
            if caller.task_meta is not None:
                return _named_task(caller.task_meta, TASK_META_KEY)
            if caller.task_header is not None:
                return _named_task(caller.task_header, TASK_HEADER)
        except UnknownTask:
            return None  # `task_for` says so
        return self._known.get(_session_key(caller))

    def forget(self, caller: Caller) -> bool:
        """Drop the session's kept task (it was found closed); False for a task the caller named."""
        if caller.task_meta is not None or caller.task_header is not None:
            return False
        self._known.pop(_session_key(caller), None)
        return True

    @staticmethod
    def unknown(caller: Caller) -> UnknownTask:
        where, raw = (
            (TASK_META_KEY, caller.task_meta) if caller.task_meta is not None else (TASK_HEADER, caller.task_header)
        )
        return UnknownTask(f"{where}: no task {str(raw).strip()!r}")


def _session_key(caller: Caller) -> str:
    return hashlib.sha256("\0".join(caller.key()).encode()).hexdigest()


def _named_task(raw: Any, where: str) -> int:
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit():
        raise UnknownTask(f"{where}: no task {text!r}")
    return int(text)


def stopped_words(task_id: int) -> str:
    """ "stopped by <person>: <reason>", what a client is told when Stop refused or ended its call."""
    stop = StopRequest.objects.select_related("requested_by").filter(task_id=task_id).first()
    if stop is None:
        return f"task {task_id} was stopped"
    person = stop.requested_by.get_username() if stop.requested_by else stop.actor
    return f"stopped by {person}: {stop.reason or 'no reason given'}"
