"""Running stopdesk's entry points as real subprocesses, on an environment of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Anything that would point a child at the test services instead of its own configuration.
INHERITED = ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "ALLOWED_HOSTS", "STOPDESK_ENV", "STOPDESK_TESTING")


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in INHERITED and not k.startswith("STOPDESK_")}
    env.update(STOPDESK_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="stopdesk.settings")
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def processes_with(marker: str) -> list[tuple[int, str]]:
    """Live processes whose environment contains `marker` (e.g. STOPDESK_DATA_DIR=/tmp/x)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "State:\tZ" in status:
            continue  # a zombie is already dead; only its parent's wait() is missing
        if needle in environ.split(b"\0"):
            found.append((int(entry.name), cmdline))
    return found
