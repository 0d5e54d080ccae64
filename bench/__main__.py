"""`make bench`: runs every bench/bench_*.py module's `run()` and prints one line per figure:
`name value unit  (target T, ratio R)`. Set BENCH=name1,name2 to run only some modules; the ones in
OFF_BY_DEFAULT (the ten-million-row `scale` group, the million-row `export`, `image`, which downloads)
run only when named.

Benchmarks run against PostgreSQL (and Redis where they need a broker) in a scratch database that
is created and dropped here, never the development data.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
# Measure what production runs: DEBUG off (the debug cursor records every query).
os.environ.setdefault("DEBUG", "0")
OFF_BY_DEFAULT = {"bench_scale", "bench_export", "bench_image"}


def main() -> int:
    from bench.harness import scratch_database

    only = {n for n in os.environ.get("BENCH", "").split(",") if n}
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    failures = 0
    with scratch_database():
        for name in names:
            named = name.removeprefix("bench_") in only or name in only
            if (only and not named) or (name in OFF_BY_DEFAULT and not named):
                continue
            module = importlib.import_module(f"bench.{name}")
            started = time.perf_counter()
            print(f"# {name}", flush=True)
            try:
                for figure in module.run():
                    print(figure.line(), flush=True)
                    failures += not figure.met
            except Exception as exc:  # one broken benchmark must not hide the others' figures
                failures += 1
                print(f"# {name} failed: {type(exc).__name__}: {exc}", flush=True)
            print(f"# {name} took {time.perf_counter() - started:.1f} s", flush=True)
    print(f"# {failures} figure(s) missed their target" if failures else "# every figure met its target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
