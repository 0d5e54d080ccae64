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

from stopdesk.models import StopRequest, Task
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
    """The task of each gateway session, read from the ledger at each call (one indexed query), so
    that every process agrees and a closed task is never reused."""

    def task_for(self, caller: Caller) -> int:
        if caller.task_meta is not None:
            return _named_task(caller.task_meta, TASK_META_KEY)
        if caller.task_header is not None:
            return _named_task(caller.task_header, TASK_HEADER)
        key = hashlib.sha256("\0".join(caller.key()).encode()).hexdigest()
        return gateway_session_task(key=key, title=caller.title(), actor=ACTOR)


def _named_task(raw: Any, where: str) -> int:
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit() or not Task.objects.filter(pk=int(text)).exists():
        raise UnknownTask(f"{where}: no task {text!r}")
    return int(text)


def stopped_words(task_id: int) -> str:
    """ "stopped by <person>: <reason>", what a client is told when Stop refused or ended its call."""
    stop = StopRequest.objects.select_related("requested_by").filter(task_id=task_id).first()
    if stop is None:
        return f"task {task_id} was stopped"
    person = stop.requested_by.get_username() if stop.requested_by else stop.actor
    return f"stopped by {person}: {stop.reason or 'no reason given'}"
