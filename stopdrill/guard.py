"""The launcher's guard: a small process that stops the launcher's children when the launcher dies
without doing it (SIGKILL, out of memory, a crash).

Each child runs in a process group of its own, so a Ctrl-C in the terminal reaches only the
launcher. Nothing then tells such a group that the launcher is gone: a parent-death signal
(PR_SET_PDEATHSIG) reaches only the process it was set in, not the gunicorn workers or Celery's
beat below it. So the launcher starts this guard first, with the read end of a pipe as its stdin,
and writes each child's process group to it. Only the launcher holds the write end; when the
launcher exits, however it exits, the kernel closes it and the guard reads end of file. It then
stops every group still alive the way the launcher would: SIGTERM, SIGQUIT (Celery's cold
shutdown), SIGKILL, each after a grace.

Standard library only: it starts in milliseconds and loads no settings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

# How long each stop signal is given before the next, harder one.
GRACE_S = {signal.SIGTERM: 4.0, signal.SIGQUIT: 3.0, signal.SIGKILL: 2.0}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_stop(pgid: int, reap: Callable[[], object] = lambda: None) -> list[str]:
    """Stop a process group, harder after each grace; returns the signals it took. `reap` waits
    for the group's leader when the caller is its parent (else its zombie keeps the group alive)."""
    steps: list[str] = []
    for sig, grace in GRACE_S.items():
        if not group_alive(pgid):
            break
        steps.append(sig.name)
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_alive(pgid):
            reap()
            time.sleep(0.05)
    reap()
    return steps


class Guard:
    """The launcher's end: starts the guard process and tells it each child's process group."""

    def __init__(self, log_path: Path) -> None:
        read, self._write = os.pipe()  # neither end is inherited by the children started later
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stopdrill.guard"],
                stdin=read,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for the launcher must not reach it
            )
        os.close(read)
        self._pipe: IO[str] = os.fdopen(self._write, "w", buffering=1)

    def watch(self, pgid: int) -> None:
        self._pipe.write(f"{pgid}\n")

    def close(self, timeout_s: float = 15.0) -> None:
        """Once the launcher has stopped its children itself: the guard finds nothing left and exits."""
        self._pipe.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups = [int(line) for line in sys.stdin if line.strip()]  # until the launcher is gone
    left = [pgid for pgid in groups if group_alive(pgid)]
    if left:
        print(f"guard: the launcher is gone; stopping process group(s) {left}", flush=True)
    threads = [threading.Thread(target=group_stop, args=(pgid,)) for pgid in left]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
