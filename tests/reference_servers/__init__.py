"""The official MCP reference servers, started for tests (installed by `make reference-servers`).

- `@modelcontextprotocol/server-everything` (npm) over Streamable HTTP on a free loopback port,
  behind a small recording proxy so a test can show what the server received and answered;
- `mcp-server-git` (PyPI, its own venv) over stdio, behind a tee that records each JSON-RPC line
  in both directions; it works on a temporary git repository;
- the TypeScript SDK (`@modelcontextprotocol/sdk`, npm), which `ts_client.mjs` uses to play an MCP
  client no one here wrote;
- the MCP Inspector (`@modelcontextprotocol/inspector`, npm), whose CLI is another such client,
  run headless (`INSPECTOR_CLI`: its launcher, given `--cli`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EVERYTHING_JS = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
GIT_SERVER = HERE / "git-venv" / "bin" / "mcp-server-git"
TS_SDK = HERE / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
TS_CLIENT = HERE / "ts_client.mjs"
INSPECTOR_CLI = (
    HERE / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
)


def missing() -> list[str]:
    """The reference servers and clients that are not installed (empty when all are)."""
    absent = []
    if not EVERYTHING_JS.exists():
        absent.append("server-everything (npm)")
    if not GIT_SERVER.exists():
        absent.append("mcp-server-git (PyPI)")
    if not TS_SDK.exists():
        absent.append("@modelcontextprotocol/sdk (npm)")
    if not INSPECTOR_CLI.exists():
        absent.append("@modelcontextprotocol/inspector (npm)")
    return absent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EverythingServer:
    """server-everything's Streamable HTTP transport as a child process."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        for _ in range(5):  # a port taken between choosing and binding: choose again
            self.port = _free_port()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    ["node", str(EVERYTHING_JS), "streamableHttp"],
                    env={**os.environ, "PORT": str(self.port)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_listening(15):
                return
            self.stop()
        raise RuntimeError(f"server-everything did not start; see {self.log_path}")

    def _wait_listening(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return True
            time.sleep(0.05)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None


@contextmanager
def everything(log_path: Path) -> Iterator[EverythingServer]:
    server = EverythingServer(log_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def make_repo(path: Path) -> Path:
    """A git repository with one commit and one staged change, ready for git_commit."""
    path.mkdir(parents=True, exist_ok=True)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "agent@example.test")
    git("config", "user.name", "Agent")
    (path / "README").write_text("first\n")
    git("add", "README")
    git("commit", "-q", "-m", "first")
    (path / "notes.txt").write_text("a change the agent commits\n")
    git("add", "notes.txt")
    return path


def slow_pre_commit(repo: Path, seconds: float) -> None:
    """A pre-commit hook that takes `seconds` (GitPython's index.commit runs the hooks), so a
    commit is still in flight when Stop arrives."""
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\nsleep {seconds}\n")
    hook.chmod(0o755)


def crashing_pre_commit(repo: Path) -> None:
    """A pre-commit hook that kills the server process running the commit: a crash mid-call."""
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nsleep 0.3\nkill -9 $PPID\nsleep 5\n")
    hook.chmod(0o755)


def git_log(repo: Path) -> list[str]:
    out = subprocess.run(["git", "log", "--format=%s"], cwd=repo, check=True, capture_output=True, text=True)
    return out.stdout.split("\n")[:-1]


def tee_command(wire_log: Path, *server: str) -> tuple[str, list[str]]:
    """The stdio command for a server behind the recording tee (`python -m
    tests.reference_servers.tee WIRE -- SERVER...`); mcp-server-git unless `server` says otherwise."""
    command = list(server) or [str(GIT_SERVER)]
    return sys.executable, ["-m", "tests.reference_servers.tee", str(wire_log), "--", *command]


def read_wire(wire_log: Path) -> list[dict[str, Any]]:
    """The recorded JSON-RPC messages: {"dir": "in"|"out", "at": t, "msg": {...}}."""
    if not wire_log.exists():
        return []
    return [json.loads(line) for line in wire_log.read_text().splitlines() if line.strip()]
