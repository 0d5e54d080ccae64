"""`manage.py up`: stopdesk on one machine, with nothing installed but Python.

The launcher prepares the database (migrations, an admin with a fresh password, the demo cast),
serves the sandbox's external parties from its own threads, and supervises four child processes:
gunicorn (the web app, static files through whitenoise), a Celery worker with beat embedded, the
watch server (uvicorn: agents' Stop watches, which the web door sends there at once), and the MCP
Stop gateway (uvicorn), in front of the sandbox MCP server at `/mcp/sandbox`.
Each child runs in a session of its own, so a Ctrl-C in the terminal reaches only the launcher,
which then stops the children in order, within a bound, and leaves no process behind:
SIGTERM (graceful), then SIGQUIT (Celery's cold shutdown), then SIGKILL to the whole group. If the
launcher itself is killed before it can, its guard process does the same (`stopdrill/guard.py`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from django.conf import settings

from reconcile.mechanisms.mcp.sandbox import READ_VALUE, SLOW_WRITE
from stopdesk import config, config_file
from stopdesk.models import WorkItem
from stopdesk.notify.models import WebhookEndpoint
from stopdesk.states import ItemState, Kind
from stopdrill.demo.start import demo_task_start
from stopdrill.guard import Guard, group_stop
from stopdrill.sandbox.server import LOOPBACK, Sandbox, start_all
from stopdrill.sandbox.webhooks import DEMO_SECRET

SANDBOX_NAMES = ("openai", "mcp", "crm", "outbox")
# A system the user set up themselves is used as it is; the sandbox stands in only for the rest.
USER_SETTINGS = {
    "openai": "OPENAI_BASE_URL",
    "mcp": "STOPDESK_MCP_URL",
    "crm": "STOPDESK_CRM_URL",
    "outbox": "STOPDESK_OUTBOX_URL",
}
LABELS = {"openai": "OpenAI", "mcp": "MCP", "crm": "CRM", "outbox": "Outbox"}
OPENAI_HOOK_PATH = "/hooks/openai"  # where the web door takes OpenAI's webhooks
RECEIVER = "webhooks"  # the sandbox's webhook receiver: not a system of the user's
WEB_URL_FILE = "web.url"
# The configuration file `up` writes when the user has none: the sandbox MCP server, named for the
# gateway (`/mcp/sandbox`) and for the reconciler, which reaches only configured servers.
DEMO_CONFIG_FILE = "stopdesk-demo.toml"
GATEWAY_SERVER = "sandbox"
PACE_S = 15.0


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            self.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signals go to all of it, and only to it
        )

    @property
    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> list[str]:
        """Stop the child's whole process group; returns what it took (for the log line)."""
        steps = group_stop(self.proc.pid, reap=self.proc.poll) if self.proc is not None else []
        if self.log is not None:
            self.log.close()
        return steps

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def own_systems(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The systems whose URL the user set, by sandbox name."""
    env = os.environ if environ is None else environ
    return {name: env[var] for name, var in USER_SETTINGS.items() if env.get(var, "").strip()}


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class Launcher:
    host: str
    port: int
    demo: bool = True
    sandbox_base_port: int | None = None  # None: the web port + 1..4 when free, else any free ports
    concurrency: int = 8
    pace: float = PACE_S
    out: Callable[[str], None] = print
    sandbox: Sandbox | None = None
    children: list[Child] = field(default_factory=list)
    guard: Guard | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    signal_name: str = ""
    metrics_token: str = ""
    openai_webhook_secret: str = ""  # made by start_sandbox when the OpenAI stand-in runs
    watch_port: int = 0  # 0: the first free port from the web port + 6 (past the sandbox's), else any
    gateway_port: int = 0  # 0: the web port + 7 when free, else any

    @property
    def watch_url(self) -> str:
        return self.url.rsplit(":", 1)[0] + f":{self.watch_port}"

    @property
    def gateway_url(self) -> str:
        return self.url.rsplit(":", 1)[0] + f":{self.gateway_port}"

    @property
    def data_dir(self) -> Path:
        return Path(settings.DATA_DIR)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host  # noqa: S104 - a name to print
        return f"http://{host}:{self.port}"

    # --- the whole run ------------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            config.preflight(create=True)  # up migrates the database it needs
            admin_password, cast_password = self.prepare()
            self.start_sandbox()
            self.register_receiver()
            self.start_children()
            if not self.wait_ready():
                return 1
            task = self.start_demo() if self.demo else None
            # `manage.py demo_task` (another process) reads it, to print the task's full address.
            (self.data_dir / WEB_URL_FILE).write_text(self.url + "\n")
            self.banner(admin_password, cast_password, task)
            return self.supervise()
        finally:
            self.shutdown()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name
        self.stopping.set()

    # --- steps --------------------------------------------------------------------------------------

    def prepare(self) -> tuple[str, str]:
        from django.contrib.auth import get_user_model
        from django.core.management import call_command, get_commands
        from django.db import connection

        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        self.out(f"Preparing the database ({config.redact(_database_label())})...")
        call_command("migrate", interactive=False, verbosity=0)
        if connection.vendor == "sqlite":
            # Readers (the pages polling) no longer wait for writers (the worker); persistent.
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA journal_mode=WAL")
        admin_password = secrets.token_urlsafe(12)
        users = get_user_model()
        admin, _ = users.objects.get_or_create(username="admin", defaults={"email": "admin@example.test"})
        admin.is_staff = admin.is_superuser = True
        admin.set_password(admin_password)
        admin.save()
        cast_password = ""
        if "create_demo_users" in get_commands():
            cast_password = secrets.token_urlsafe(9)
            call_command("create_demo_users", password=cast_password, stdout=open(os.devnull, "w"))  # noqa: SIM115
        connection.close()  # the children write from here on; hold no SQLite lock
        return admin_password, cast_password

    @property
    def own(self) -> dict[str, str]:
        return own_systems()

    def start_sandbox(self) -> None:
        # The webhook receiver always runs: it is where the demo's notifications go.
        stand_ins = [name for name in SANDBOX_NAMES if name not in self.own] + [RECEIVER]
        base = self.sandbox_base_port if self.sandbox_base_port is not None else self.port + 1
        wanted = {name: base + offset for offset, name in enumerate((*SANDBOX_NAMES, RECEIVER)) if name in stand_ins}
        if base == 0 or not all(_port_free(LOOPBACK, p) for p in wanted.values()):
            wanted = {}
        self.sandbox = start_all(ports=wanted or None, only=stand_ins)
        if "openai" in stand_ins:
            # Drafts take long enough that a person can stop them mid-run, short enough to finish.
            # Its webhooks come to the web door's /hooks/openai, signed with a secret made here, as
            # OpenAI's would: at least once, some twice, in no particular order.
            self.openai_webhook_secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
            self.sandbox.openai.configure(
                run_s=max(5.0, self.pace * 4.5),
                webhook_url=self.url + OPENAI_HOOK_PATH,
                webhook_secret=self.openai_webhook_secret,
                webhook_duplicate_rate=0.2,
                webhook_jitter_s=0.5,
            )
        self.metrics_token = os.environ.get("STOPDESK_METRICS_TOKEN") or secrets.token_urlsafe(16)

    def register_receiver(self) -> None:
        """The demo's notifications go to the sandbox receiver, which verifies their signatures."""
        from django.db import connection

        assert self.sandbox is not None
        WebhookEndpoint.objects.update_or_create(
            name="sandbox receiver", defaults={"url": self.sandbox.urls[RECEIVER], "secret": DEMO_SECRET}
        )
        connection.close()  # the children write from here on; hold no SQLite lock

    def child_env(self) -> dict[str, str]:
        assert self.sandbox is not None
        env = dict(os.environ)
        env.update(
            STOPDESK_DATA_DIR=str(self.data_dir), DJANGO_SETTINGS_MODULE="stopdesk.settings", PYTHONUNBUFFERED="1"
        )
        # Only the stand-ins' URLs are filled in; what the user set stays as they set it.
        for name, url in self.sandbox.urls.items():
            if name in USER_SETTINGS:
                env[USER_SETTINGS[name]] = url
        env.update(STOPDESK_METRICS_TOKEN=self.metrics_token, STOPDESK_BASE_URL=self.url)
        # The web door sends every watch to the watch server this launcher runs.
        env["STOPDESK_WATCH_URL"] = self.watch_url
        if "openai" in self.sandbox.urls:
            env["OPENAI_API_KEY"] = env.get("STOPDESK_SANDBOX_OPENAI_KEY", "sk-sandbox")
            env["OPENAI_WEBHOOK_SECRET"] = self.openai_webhook_secret
        if "mcp" in self.sandbox.urls and not config_file.path():
            env[config_file.VARIABLE] = str(self.demo_config(self.sandbox.urls["mcp"]))
        env.setdefault("LOG_LEVEL", "INFO")
        return env

    def demo_config(self, mcp_url: str) -> Path:
        """The sandbox MCP server as a configured server, with the status check of its write."""
        path = self.data_dir / DEMO_CONFIG_FILE
        server = f"mcp.servers.{GATEWAY_SERVER}"
        check = f"{server}.tools.{SLOW_WRITE}.status_check"
        path.write_text(
            f"# Written by `manage.py up` on every start: the sandbox MCP server, for the MCP Stop gateway.\n"
            f"[{server}]\nurl = {_toml(mcp_url)}\n\n"
            f"[{check}]\ntool = {_toml(READ_VALUE)}\narguments = {{ key = {_toml('{key}')} }}\n"
            f"completed_if_contains = {_toml('{key}={value}')}\n"
        )
        return path

    def start_children(self) -> None:
        python, logs = sys.executable, self.data_dir / "logs"
        web = Child(
            "web",
            [
                python, "-m", "gunicorn", "stopdesk.wsgi:application",
                "--bind", f"{self.host}:{self.port}",
                "--worker-class", "gthread", "--workers", "2", "--threads", "8",
                "--graceful-timeout", "3", "--timeout", "60",
                "--access-logfile", "-", "--error-logfile", "-", "--no-control-socket",
            ],
            logs / "web.log",
        )  # fmt: skip
        worker = Child(
            "worker",
            [
                python, "-m", "celery", "-A", "stopdesk", "worker", "--beat",
                "--schedule", str(self.data_dir / "celerybeat-schedule"),
                # Threads: a demo agent waiting between stages costs a thread, not a process.
                "--pool", "threads", "--concurrency", str(self.concurrency),
                "--hostname", f"stopdesk@{socket.gethostname()}-{self.port}",
                "--without-gossip", "--without-mingle", "--loglevel", "INFO",
            ],
            logs / "worker.log",
        )  # fmt: skip
        if not self.watch_port:
            wanted = self.port + 6
            self.watch_port = wanted if _port_free(self.host, wanted) else free_port(self.host)
        watch = Child(
            "watch",
            [
                python, "-m", "uvicorn", "stopdesk.asgi:application",
                "--host", self.host, "--port", str(self.watch_port),
                "--no-access-log", "--timeout-keep-alive", "75", "--log-level", "warning",
            ],
            logs / "watch.log",
        )  # fmt: skip
        if not self.gateway_port:
            wanted = self.port + 7
            self.gateway_port = wanted if _port_free(self.host, wanted) else free_port(self.host)
        gateway = Child(
            "gateway",
            [
                python, "-m", "uvicorn", "stopdesk.gateway.asgi:application", "--factory",
                "--host", self.host, "--port", str(self.gateway_port),
                "--no-access-log", "--timeout-keep-alive", "75", "--log-level", "warning",
            ],
            logs / "gateway.log",
        )  # fmt: skip
        env = self.child_env()
        self.guard = Guard(logs / "guard.log")
        for child in (web, worker, watch, gateway):
            child.start(env)
            self.children.append(child)
            assert child.proc is not None
            self.guard.watch(child.proc.pid)  # its process group: the child leads a session of its own

    def wait_ready(self, timeout_s: float = 90.0) -> bool:
        """The web app, the watch server and the gateway answer /healthz and the worker has said it
        is ready."""
        self.out("Starting the web server, the worker, the watch server and the MCP gateway...")
        worker = self.children[1]
        deadline = time.monotonic() + timeout_s
        web_ok = worker_ok = watch_ok = gateway_ok = False
        while time.monotonic() < deadline and not self.stopping.is_set():
            for child in self.children:
                if child.exited is not None:
                    self.out(f"The {child.name} process exited (status {child.exited}) while starting:\n{child.tail()}")
                    return False
            web_ok = web_ok or _healthy(self.url)
            watch_ok = watch_ok or _healthy(self.watch_url)
            gateway_ok = gateway_ok or _healthy(self.gateway_url)
            worker_ok = worker_ok or " ready." in worker.tail(200)
            if web_ok and worker_ok and watch_ok and gateway_ok:
                return True
            time.sleep(0.2)
        if not self.stopping.is_set():
            self.out(
                f"Not ready within {timeout_s:.0f}s (web {web_ok}, worker {worker_ok}, watch {watch_ok}, "
                f"gateway {gateway_ok}); "
                f"see {self.data_dir / 'logs'}."
            )
        return False

    def start_demo(self) -> Any:
        from django.db import connection

        task = demo_task_start(pace=self.pace)
        connection.close()
        return task

    def banner(self, admin_password: str, cast_password: str, task: Any) -> None:
        assert self.sandbox is not None
        urls = self.sandbox.urls
        lines = [
            "",
            "stopdesk is running.",
            "",
            f"  Open       {self.url}/",
            f"  Sign in    admin / {admin_password}",
        ]
        if cast_password:
            lines.append(f"  Demo cast  operator, reviewer, approver, approver2 / {cast_password}")
        if task is not None:
            p = self.pace
            lines += [
                f"  Demo task  {self.url}/tasks/{task.pk}/  ({task.title})",
                f"             drafts now; MCP lookup at +{p:.0f}s; CRM record at +{2 * p:.0f}s; "
                f"email at +{3 * p:.0f}s; done at about +{4.5 * p:.0f}s. Press Stop at any point.",
            ]
        lines.append(f"  Watch      {self.watch_url}  (agents' Stop watches; the web door sends them here)")
        lines.append(f"  Gateway    {self.gateway_lines()}")
        lines += self.systems_lines(urls)
        lines += [
            f"  Webhooks   {urls[RECEIVER]}  (signed notifications, verified there; GET lists them)",
            *(
                [f"  OpenAI in  {self.url}{OPENAI_HOOK_PATH}  (the stand-in's response.* webhooks, signed)"]
                if self.openai_webhook_secret
                else []
            ),
            f"  Metrics    curl -H 'Authorization: Bearer {self.metrics_token}' {self.url}/metrics",
        ]
        lines += [
            f"  Data       {self.data_dir}  (logs in {self.data_dir / 'logs'})",
            "  New demo   .venv/bin/python manage.py demo_task [--stage drafts|tools|record|email|done]"
            + (
                ""
                if self.data_dir == Path(settings.BASE_DIR) / "var"
                else f"  (with STOPDESK_DATA_DIR={self.data_dir})"
            ),
            "",
            "Press Ctrl-C to stop everything.",
        ]
        self.out("\n".join(lines))

    def gateway_lines(self) -> str:
        """Where an MCP client points instead of its server: the sandbox's path, or the servers the
        user's own configuration file names."""
        try:
            names = httpx.get(f"{self.gateway_url}/healthz", timeout=5.0).json()["servers"]
        except (httpx.HTTPError, ValueError, KeyError):
            names = []
        if GATEWAY_SERVER in names:
            return f"{self.gateway_url}/mcp/{GATEWAY_SERVER}  (the MCP Stop gateway: point an MCP client here)"
        served = ", ".join(f"/mcp/{name}" for name in names) or "no MCP servers configured"
        return f"{self.gateway_url}  (the MCP Stop gateway: {served})"

    def systems_lines(self, sandbox_urls: dict[str, str]) -> list[str]:
        """One line per external system: the user's own (real) or the sandbox's stand-in."""
        own, lines = self.own, []
        for name in SANDBOX_NAMES:
            label = f"{LABELS[name]:<7}"
            if name in own:
                lines.append(f"  {label}    {config.redact(own[name])}  (yours, from {USER_SETTINGS[name]}: real)")
            else:
                hint = "  (edit a record as someone else)" if name == "crm" else ""
                path = "/messages" if name == "outbox" else ("/" if name == "crm" else "")
                lines.append(f"  {label}    {sandbox_urls[name]}{path}  (sandbox){hint}")
        return lines

    def supervise(self) -> int:
        while not self.stopping.wait(0.5):
            for child in self.children:
                if child.exited is not None:
                    self.out(f"The {child.name} process exited (status {child.exited}); stopping.\n{child.tail()}")
                    return 1
        return 0

    def shutdown(self) -> None:
        if not self.children and self.sandbox is None and self.guard is None:
            return
        self.out(f"\nStopping{f' ({self.signal_name})' if self.signal_name else ''}...")
        # Signals during shutdown must not interrupt it halfway.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        threads = [threading.Thread(target=self._stop_child, args=(c,)) for c in reversed(self.children)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.children.clear()
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self.sandbox is not None:
            self.sandbox.stop()
            self.sandbox = None
        with contextlib.suppress(OSError):
            (self.data_dir / WEB_URL_FILE).unlink()
        self.out("Stopped.")

    def _stop_child(self, child: Child) -> None:
        steps = child.stop()
        if "SIGQUIT" in steps and child.name == "worker":
            # A slow graceful shutdown alone does not mean work was cut short: say so only when the
            # ledger shows a job still running.
            running = _jobs_running()
            if running:
                self.out(
                    f"  worker: {running} job{'s were' if running != 1 else ' was'} still running; "
                    "the next start reconciles them from the database."
                )


def _toml(value: str) -> str:
    """A TOML basic string (JSON's string escapes are TOML's)."""
    return json.dumps(value)


def _jobs_running() -> int:
    from django.db import connection

    try:
        return WorkItem.objects.filter(state=ItemState.RUNNING, kind=Kind.LOCAL_WORKER).count()
    except Exception:  # a message at shutdown must not fail the shutdown
        return 0
    finally:
        connection.close()


def web_url(default: str = "http://127.0.0.1:8000") -> str:
    """The address `manage.py up` serves on, as it wrote it to the data folder."""
    try:
        return (Path(settings.DATA_DIR) / WEB_URL_FILE).read_text().strip() or default
    except OSError:
        return default


def _database_label() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"SQLite {db['NAME']}"
    return f"PostgreSQL {db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"
