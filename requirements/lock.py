"""`make lock`: resolve requirements/*.in into the two locks, with pip's own resolver.

- requirements.lock: client.in and server.in, what `pip install "stopdesk[server]"` needs; the
  image installs it and nothing else.
- requirements-dev.lock: every .in file here (the framework extras and dev.in too), for `make test`
  and `make lint`; constrained by requirements.lock, so the tests run the versions the image runs.

Each lock keeps the versions it already pins where they still fit (they are handed to pip as
constraints), so adding one line to an .in file adds that package and what it needs, and moves
nothing else. Where the old pins no longer fit, or with `--upgrade`, it resolves afresh: the newest
versions the .in files allow. pip only resolves here (`--dry-run --report`); nothing is installed.

    python requirements/lock.py [--upgrade]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNTIME_INPUTS = ("client.in", "server.in")
RUNTIME_LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"


# Extras that cannot be installed beside the server, each locked apart with its own venv:
# crewai.in (tests/frameworks_venvs/crewai.lock, `make crewai-venv`).
APART = {"crewai.in"}


def dev_inputs() -> list[str]:
    return sorted(p.name for p in HERE.glob("*.in") if p.name not in APART)


def resolve(python: Path, inputs: list[str], constraints: list[Path]) -> list[str] | None:
    """`name==version` for every package pip would install for `inputs` under `constraints`,
    sorted as pip freeze sorts; None when pip finds no solution."""
    with tempfile.TemporaryDirectory(prefix="stopdesk-lock-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        argv += ["--disable-pip-version-check", "--report", str(report)]
        for name in inputs:
            argv += ["-r", str(HERE / name)]
        for path in constraints:
            argv += ["-c", str(path)]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
        if done.returncode != 0:
            problem = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            print(f"lock: pip found no solution: {' '.join(problem)[:300]}", file=sys.stderr)
            return None
        installs = json.loads(report.read_text())["install"]
    pins = {(i["metadata"]["name"], i["metadata"]["version"]) for i in installs}
    return [f"{name}=={version}" for name, version in sorted(pins, key=lambda p: p[0].lower())]


def write_lock(path: Path, pins: list[str], inputs: list[str]) -> None:
    header = f"# Written by `make lock` from requirements/{', requirements/'.join(inputs)}: do not edit by hand.\n"
    old = set(path.read_text().splitlines()) if path.exists() else set()
    added = sorted(set(pins) - old)
    removed = sorted({line for line in old if "==" in line and not line.startswith("#")} - set(pins))
    path.write_text(header + "".join(f"{pin}\n" for pin in pins))
    print(f"lock: {path.name}: {len(pins)} packages; + {', '.join(added) or 'none'}; - {', '.join(removed) or 'none'}")


def lock(python: Path, path: Path, inputs: list[str], required: list[Path], upgrade: bool) -> None:
    pins = None
    if not upgrade and path.exists():
        pins = resolve(python, inputs, [*required, path])
        if pins is None:
            print(f"lock: {path.name}: its old pins no longer fit; resolving afresh", file=sys.stderr)
    if pins is None:
        pins = resolve(python, inputs, required)
    if pins is None:
        raise SystemExit(f"lock: {path.name}: the .in files cannot be satisfied together")
    write_lock(path, pins, inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upgrade", action="store_true", help="ignore the old pins: newest versions allowed")
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 12):
        raise SystemExit("lock: run with Python 3.12, the version the image and the tests use")
    with tempfile.TemporaryDirectory(prefix="stopdesk-lock-venv-") as tmp:
        # A scratch environment: the resolution must not depend on what this interpreter has installed.
        venv.create(tmp, with_pip=True)
        python = Path(tmp) / "bin" / "python"
        lock(python, RUNTIME_LOCK, list(RUNTIME_INPUTS), [], args.upgrade)
        lock(python, DEV_LOCK, dev_inputs(), [RUNTIME_LOCK], args.upgrade)


if __name__ == "__main__":
    main()
