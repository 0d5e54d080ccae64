"""The production shape on loopback, for benchmarks: the web door (gunicorn, 2 processes x 8
threads, as `python -m stopdesk web` runs it) told where the watch server is, and the watch server
(uvicorn, as `python -m stopdesk watch`), both on the scratch database; the MCP gateway as
`python -m stopdesk mcp-gateway` runs it. Plus a person signed in to the dashboard, and percentiles."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from bench.harness import Figure

OPERATOR_PASSWORD = "bench-operator-pass-1"


@dataclass(frozen=True)
class Deployed:
    web_url: str
    watch_url: str


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_env(**extra: str) -> dict[str, str]:
    """A benchmark server's environment: this process's (the scratch database), production's
    DEBUG off and quiet logs, and `extra`."""
    return {
        **os.environ,
        "DEBUG": "0",
        "LOG_LEVEL": "ERROR",
        "DJANGO_SETTINGS_MODULE": "stopdesk.settings",
        **extra,
    }


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited at start")
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer /healthz within 60 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def deployed() -> Iterator[Deployed]:
    web_port, watch_port = _free_port(), _free_port()
    found = Deployed(f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{watch_port}")
    env = _server_env(STOPDESK_WATCH_URL=found.watch_url)
    host = ("--host", "127.0.0.1", "--port", str(watch_port))
    quiet = ("--no-access-log", "--log-level", "warning", "--timeout-keep-alive", "75")
    watch = _spawn(["uvicorn", "stopdesk.asgi:application", *host, *quiet], env)
    web = _spawn(
        [
            *("gunicorn", "stopdesk.wsgi:application", "--bind", f"127.0.0.1:{web_port}"),
            *("--worker-class", "gthread", "--workers", "2", "--threads", "8", "--no-control-socket"),
        ],
        env,
    )
    try:
        _healthy(found.watch_url, watch)
        _healthy(found.web_url, web)
        yield found
    finally:
        for proc in (web, watch):
            _stop(proc)


@contextlib.contextmanager
def gateway_process(config: str) -> Iterator[str]:
    """`python -m stopdesk mcp-gateway` in its own process on the scratch database, with `config`
    as its configuration file (TOML); yields its base URL. A Stop pressed in the benchmark's
    process reaches it as it reaches a deployed gateway: through PostgreSQL's notifications."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "stopdesk.toml")
        with open(path, "w") as file:
            file.write(config)
        port = _free_port()
        env = _server_env(GATEWAY_PORT=str(port), STOPDESK_CONFIG_FILE=path)
        gateway = _spawn(["stopdesk", "mcp-gateway", "--log-level", "warning"], env)
        url = f"http://127.0.0.1:{port}"
        try:
            _healthy(url, gateway)
            yield url
        finally:
            _stop(gateway)


def operator_create() -> str:
    """A person who may press Stop; returns the name to sign in with."""
    from django.contrib.auth.models import Group, User

    from stopdesk.permissions import roles_ensure

    roles_ensure()
    name = f"bench-operator-{os.getpid()}-{time.time_ns()}"
    user = User.objects.create_user(name, f"{name}@example.test", password=OPERATOR_PASSWORD)
    user.groups.add(Group.objects.get(name="operators"))
    return name


def signed_in(web_url: str, username: str) -> httpx.Client:
    browser = httpx.Client(base_url=web_url, timeout=60)
    page = browser.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    if token is None:
        raise RuntimeError("no sign-in form")
    answer = browser.post(
        "/login/",
        data={"username": username, "password": OPERATOR_PASSWORD, "csrfmiddlewaretoken": token[1]},
        headers={"Referer": web_url + "/login/"},
    )
    if answer.status_code != 302:
        raise RuntimeError(f"sign-in refused: {answer.status_code}")
    return browser


def timed_ms(request: Callable[[], httpx.Response], expect: int) -> float:
    started = time.perf_counter()
    response = request()
    took = (time.perf_counter() - started) * 1000
    if response.status_code != expect:
        raise RuntimeError(f"{response.request.url} answered {response.status_code}, not {expect}")
    return took


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def p50_p99(name: str, values: list[float], *, target_p99: float | None = None) -> list[Figure]:
    return [
        Figure(f"{name}.p50", percentile(values, 0.5), "ms"),
        Figure(f"{name}.p99", percentile(values, 0.99), "ms", target=target_p99),
    ]
