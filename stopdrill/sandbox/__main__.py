"""Serve the four sandbox parties until interrupted: `python -m stopdrill.sandbox [--base-port N]`."""

from __future__ import annotations

import argparse
import threading

from stopdrill.sandbox.server import party_names, start_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-port", type=int, default=0, help="serve on N..N+3 (default: free ports)")
    args = parser.parse_args()
    names = [name for name in party_names() if name != "webhooks"]  # the receiver takes a free port
    ports = {name: args.base_port + offset for offset, name in enumerate(names)} if args.base_port else None
    with start_all(ports=ports) as sandbox:
        for name, url in sandbox.urls.items():
            print(f"{name:7} {url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopping", flush=True)


if __name__ == "__main__":
    main()
