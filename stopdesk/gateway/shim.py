"""`stopdesk-mcp [--name NAME] [--task ID] -- COMMAND [ARGS...]` (also `python -m stopdesk mcp-stdio`):
the MCP Stop gateway for one client over stdio, run by the client's MCP configuration instead of
the server's command, which follows `--`. What it serves is in `stdio.py`.

stdout is the wire: nothing may be printed there, not even usage (a client reads only JSON-RPC
from it), so every message here goes to stderr. Bad usage exits 2; a database that does not answer
or is not migrated exits 1, each with one line saying what to do. This module imports nothing of
Django's until the settings are set up."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

PROG = "stopdesk-mcp"
USAGE = f"usage: {PROG} [--name NAME] [--task ID] -- COMMAND [ARGS...]   (or {PROG} --name NAME, a configured server)"


class UsageError(ValueError):
    """The command line cannot be run as written."""


@dataclass(frozen=True)
class Invocation:
    name: str | None
    task: int | None
    command: tuple[str, ...]


def parse(argv: list[str]) -> Invocation:
    """Options before `--`, the server's command line after it, as the client's config gives it."""
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = argv[:split], tuple(argv[split + 1 :])
    if "--" in argv and not command:
        raise UsageError("no server command after --")
    values: dict[str, str] = {}
    rest = list(options)
    while rest:
        option = rest.pop(0)
        key, _, inline = option.partition("=")
        if key not in ("--name", "--task"):
            if not option.startswith("-"):
                raise UsageError(f"put the server's command after --: {PROG} -- {' '.join(options)}")
            raise UsageError(f"unknown option {key}")
        if not inline and not rest:
            raise UsageError(f"{key} needs a value")
        values[key] = inline or rest.pop(0)
    name = values.get("--name")
    if name is not None and not name.strip():
        raise UsageError("--name needs a value")
    raw_task = values.get("--task")
    if raw_task is not None and not raw_task.strip().isdigit():
        raise UsageError(f"--task needs a task number, not {raw_task!r}")
    if not command and name is None:
        raise UsageError("no server command (give it after --)")
    return Invocation(name=name, task=int(raw_task) if raw_task is not None else None, command=command)


def _fail(message: str, status: int) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(status)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(USAGE, file=sys.stderr)
        raise SystemExit(0)
    try:
        invocation = parse(argv)
    except UsageError as exc:
        _fail(f"{exc}\n{USAGE}", 2)
    if importlib.util.find_spec("django") is None:  # `pip install stopdesk` is the client alone
        _fail('the MCP gateway is part of the server, not installed here: pip install "stopdesk[server]"', 1)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
    import anyio
    import django

    django.setup()  # a bad setting raises config.ConfigError: one line, exit status 1
    from django.core.management.base import CommandError
    from django.db import connection

    from reconcile.mechanisms.mcp.servers import ServerConfigError, configured_servers
    from reconcile.mechanisms.registry import mechanism_settings, timing_problems
    from stopdesk import config
    from stopdesk.gateway.stdio import OneTask, ShimRefused, serve, server_spec, task_exists

    if problems := timing_problems():
        raise config.ConfigError(problems[0])
    try:
        config.require_migrated_database()  # reachable and migrated, or one line saying what to do
    except CommandError as exc:
        _fail(str(exc), 1)
    try:
        configured = configured_servers(mechanism_settings("mcp").options)
    except ServerConfigError as exc:
        raise config.ConfigError(str(exc)) from None
    try:
        spec = server_spec(
            name=invocation.name, command=invocation.command, configured=configured, environ=dict(os.environ)
        )
    except ShimRefused as exc:
        _fail(str(exc), 2)
    if invocation.task is not None and not task_exists(invocation.task):
        _fail(f"--task {invocation.task}: there is no such task", 2)
    connection.close()  # the ledger's calls run on threads of their own, with their own connections
    anyio.run(serve, spec, OneTask(invocation.task))


if __name__ == "__main__":
    main()
