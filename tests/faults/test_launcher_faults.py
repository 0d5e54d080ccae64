"""`make run`'s launcher SIGKILLed with the demo running: it cannot stop its children itself, and
its guard process does, so nothing it started outlives it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stopdrill.launcher import free_port
from tests.run.helpers import processes_with
from tests.run.test_up import START_WITHIN_S, Up

pytestmark = [pytest.mark.faults, pytest.mark.slow]

# The guard's whole escalation (SIGTERM, SIGQUIT, SIGKILL graces: 9 s) and a margin.
GONE_WITHIN_S = 15.0


def test_the_launcher_killed_with_sigkill_leaves_no_child_running(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", free_port())
    try:
        assert up.wait_for("Press Ctrl-C to stop everything.", START_WITHIN_S), up.output
        children = [cmd for pid, cmd in processes_with(up.marker) if pid != up.proc.pid]
        for what in ("gunicorn", "celery", "stopdrill.guard"):
            assert any(what in cmd for cmd in children), (what, children)

        up.proc.kill()  # SIGKILL: no handler, no shutdown, no finally runs in the launcher
        up.proc.wait(5)
        killed = time.monotonic()
        left = processes_with(up.marker)
        while left and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.1)
            left = processes_with(up.marker)
        gone_after = time.monotonic() - killed
        print(f"fault.launcher_sigkill processes={len(children)} gone_after_s={gone_after:.1f} left={len(left)}")

        assert left == [], f"still running {gone_after:.1f}s after the launcher was killed: {left}"
        guard_log = (up.data_dir / "logs" / "guard.log").read_text()
        assert "the launcher is gone" in guard_log
    finally:
        up.kill_everything()
