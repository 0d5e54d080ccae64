"""The nightly soak: the race and browser tests run again and again, each run a fresh pytest
process, and every test that failed in any run is named with how often. A test that failed in
some runs and passed in others is a flake; the count is printed and the exit status is 1 while it
is not 0. A failing run's report (its assertion and traceback) is printed as it happens.

    python -m tests.soak --runs 50 tests/ledger/test_stop_races.py tests/browser
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# What the soak runs unless told otherwise: the tests that race threads, processes and a browser
# against the database, where an ordering the code did not expect shows up only now and then.
DEFAULT_TESTS = (
    "tests/ledger/test_stop_races.py",
    "tests/ledger/test_stop_order.py",
    "tests/ledger/test_gate.py",
    "tests/reconcile/test_report_race.py",
    "tests/notify/test_digest_races.py",
    "tests/browser",
)


def run_once(paths: list[str], extra: list[str]) -> tuple[set[str], int, int]:
    """One pytest process: the ids of the tests that failed or errored, how many ran, how many
    were skipped."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *extra, *paths],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        if not report.exists():
            return {"<pytest did not run>"}, 0, 0
        failed, ran, skipped = set(), 0, 0
        for case in ET.parse(report).iter("testcase"):
            ran += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                failed.add(name)
                # What failed, as pytest reported it: the line and the values, for finding the cause.
                print(f"  failed: {name}: {problem.get('message', '')}", flush=True)
                print(textwrap.indent((problem.text or "").strip()[-3000:], "    "), flush=True)
            elif case.find("skipped") is not None:
                skipped += 1
        return failed, ran, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_TESTS))
    parser.add_argument("--pytest-args", default="", help="passed to each pytest run, split on spaces")
    args = parser.parse_args(argv)
    failures: Counter[str] = Counter()
    failed_runs = 0
    began = time.monotonic()
    for number in range(1, args.runs + 1):
        failed, ran, skipped = run_once(args.paths, args.pytest_args.split())
        failures.update(failed)
        failed_runs += bool(failed)
        print(f"run {number}/{args.runs}: {ran} tests, {len(failed)} failed, {skipped} skipped", flush=True)
    # Failed in every run: broken, not flaky; failed in some: a flake to find and fix.
    flaky = {name: n for name, n in failures.items() if n < args.runs}
    for name, n in sorted(failures.items()):
        print(f"  {'flaky' if name in flaky else 'broken'} {n}/{args.runs} {name}")
    print(f"soak.runs {args.runs} runs")
    print(f"soak.failed_runs {failed_runs} runs")
    print(f"soak.flakes {len(flaky)} tests")
    print(f"soak.broken {len(failures) - len(flaky)} tests")
    print(f"soak.seconds {time.monotonic() - began:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
