"""The production entry point: `python -m stopdesk {check,migrate,web,watch,worker,beat,mcp-gateway}`,
and `python -m stopdesk mcp-stdio -- COMMAND...`, the stdio shim (`stopdesk-mcp`, gateway/shim.py).

Each command first checks the configuration and that the database and the broker answer, and
exits with one readable line when they do not; then it replaces itself with the real server
(gunicorn, uvicorn for the stop watch endpoint and the agent door and for the MCP Stop gateway, `celery worker`,
`celery beat`), so signals from
the container reach it directly.

Environment: DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY, ALLOWED_HOSTS, STOPDESK_ENV=production,
OPENAI_API_KEY / OPENAI_BASE_URL; STOPDESK_BIND_HOST (127.0.0.1; the image sets 0.0.0.0), PORT (8000;
`watch`: WATCH_PORT, 8001; `mcp-gateway`: GATEWAY_PORT, 8002), WEB_CONCURRENCY (2), WORKER_CONCURRENCY (8);
STOPDESK_WATCH_URL (where agents reach `watch`: the web door sends every watch there at once).
"""

from __future__ import annotations

import os
import sys

from stopdesk import config

USAGE = (
    "usage: python -m stopdesk {check,migrate,web,watch,worker,beat,mcp-gateway} [extra arguments for the server]\n"
    "       python -m stopdesk ready {worker,beat}   (exit 0 when its heartbeat is recent: health checks)\n"
    "       python -m stopdesk mcp-stdio [--name NAME] [--task ID] -- COMMAND [ARGS...]   (the stdio shim)"
)


COMMANDS = ("check", "migrate", "web", "watch", "worker", "beat", "mcp-gateway")


def _exec(argv: list[str]) -> None:
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # noqa: S606 - fixed programs, arguments from the operator


def ready(component: str) -> None:
    """The readiness check (the same function as /readyz) for one process kind; no web needed."""
    import django

    django.setup()
    from stopdesk.health import processes_ready  # after django.setup(): it reads the models

    found = processes_ready((component,))[component]
    print(f"stopdesk: {component} heartbeat age {found['age_s']} s; {'ready' if found['ok'] else 'NOT ready'}")
    raise SystemExit(0 if found["ok"] else 1)


NOT_INSTALLED = 'stopdesk: the server is not installed here (only the client is): pip install "stopdesk[server]"'


def _require_server() -> None:
    """`pip install stopdesk` is the HTTP client alone (httpx): say so in one line, not a traceback."""
    import importlib.util

    if importlib.util.find_spec("django") is None:
        print(NOT_INSTALLED, file=sys.stderr)
        raise SystemExit(1)


def main(argv: list[str]) -> None:
    _require_server()
    if argv[:1] == ["mcp-stdio"]:
        # Run by an MCP client, not an operator: it checks only the database, and stdout is its wire.
        from stopdesk.gateway.shim import main as shim

        shim(argv[1:])
        return
    if argv[:1] == ["ready"]:
        if argv[1:] not in (["worker"], ["beat"]):
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
        ready(argv[1])
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    command, extra = argv[0], argv[1:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
    import django

    django.setup()  # a bad setting raises config.ConfigError here: one line, exit status 1

    # Checked for every command, so `check` finds a bad number before `web` or `worker` would.
    port = config.integer("PORT", 8000, maximum=65535)
    watch_port = config.integer("WATCH_PORT", 8001, maximum=65535)
    gateway_port = config.integer("GATEWAY_PORT", 8002, maximum=65535)
    host = config.bind_host()
    web_processes = config.integer("WEB_CONCURRENCY", 2)
    worker_processes = config.integer("WORKER_CONCURRENCY", 8)
    from reconcile.mechanisms.registry import timing_problems  # after django.setup(): it reads settings

    if problems := timing_problems():
        raise config.ConfigError(problems[0])
    # The watch server (watches, and the agent door's registrations) and the gateway write the
    # ledger themselves, with no job to queue: neither needs the broker.
    config.preflight(broker=command not in ("migrate", "watch", "mcp-gateway"), create=command == "migrate")
    python = sys.executable
    if command == "check":
        print("stopdesk: configuration ok; the database and the broker answer.")
    elif command == "migrate":
        _exec([python, "-m", "django", "migrate", "--noinput", *extra])
    elif command == "web":
        _exec([
            python, "-m", "gunicorn", "stopdesk.wsgi:application",
            "--bind", f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            "--worker-class", "gthread", "--workers", str(web_processes), "--threads", "8",
            "--access-logfile", "-", "--no-control-socket", *extra,
        ])  # fmt: skip
    elif command == "watch":
        # One process, one event loop: every waiting watcher is a future woken by the process's one
        # LISTEN connection, so a thousand of them cost no threads and no database connections.
        _exec([
            python, "-m", "uvicorn", "stopdesk.asgi:application",
            "--host", host, "--port", str(watch_port),
            "--no-access-log", "--timeout-keep-alive", "75", *extra,
        ])  # fmt: skip
    elif command == "mcp-gateway":
        # One event loop holds every client's call in flight; `/mcp/<name>` per configured MCP server.
        _exec([
            python, "-m", "uvicorn", "stopdesk.gateway.asgi:application", "--factory",
            "--host", host, "--port", str(gateway_port),
            "--no-access-log", "--timeout-keep-alive", "75", *extra,
        ])  # fmt: skip
    elif command == "worker":
        _exec([
            python, "-m", "celery", "-A", "stopdesk", "worker",
            "--concurrency", str(worker_processes), "--loglevel", "INFO", *extra,
        ])  # fmt: skip
    elif command == "beat":
        schedule = os.environ.get("STOPDESK_BEAT_SCHEDULE", "/tmp/celerybeat-schedule")  # noqa: S108
        _exec([python, "-m", "celery", "-A", "stopdesk", "beat", "--schedule", schedule, "--loglevel", "INFO", *extra])


if __name__ == "__main__":
    main(sys.argv[1:])
