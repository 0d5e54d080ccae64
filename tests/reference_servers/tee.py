"""Run a stdio MCP server and record every JSON-RPC line in both directions.

    python -m tests.reference_servers.tee WIRE_LOG -- COMMAND [ARGS...]

"in" is what the server received, "out" what it answered. When the server dies, the tee exits
with its exit status (as a crashed server's process would look to the client); when the client
closes stdin, the server's stdin is closed too and the tee waits for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time


def main() -> int:
    wire_path = sys.argv[1]
    command = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    lock = threading.Lock()
    wire = open(wire_path, "a", buffering=1)  # noqa: SIM115  # open for the tee's whole life

    def record(direction: str, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = {"raw": line.decode(errors="replace")}
        with lock:
            wire.write(json.dumps({"dir": direction, "pid": os.getpid(), "at": time.time(), "msg": message}) + "\n")

    def pump_in() -> None:
        assert child.stdin is not None
        for line in sys.stdin.buffer:
            record("in", line)
            try:
                child.stdin.write(line)
                child.stdin.flush()
            except (BrokenPipeError, OSError):
                return
        with contextlib.suppress(OSError):
            child.stdin.close()

    threading.Thread(target=pump_in, daemon=True).start()
    for line in child.stdout:
        record("out", line)
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    code = child.wait()
    with lock:
        wire.write(
            json.dumps({"dir": "exit", "pid": os.getpid(), "at": time.time(), "msg": {"returncode": code}}) + "\n"
        )
        wire.flush()
    return 0 if code == 0 else 1


if __name__ == "__main__":
    # os._exit: the stdin pump is a daemon thread blocked in a read; a normal interpreter
    # shutdown would abort on its buffer lock.
    sys.stdout.flush()
    os._exit(main())
