"""What the image installs: the runtime lock against everything (`BENCH=image make bench`).

image.runtime_mb        site-packages of a venv with requirements.lock alone (what the Dockerfile installs)
image.runtime_packages  its distributions
image.dev_mb            site-packages with requirements-dev.lock (the test and lint tools, every
                        framework extra: what the image installed when one lock held it all)
image.dev_packages      its distributions
image.runtime_share     runtime_mb / dev_mb

Each lock goes into a scratch venv of its own (pip, from the registry or its cache); sizes are
`du -sk` of site-packages, pip itself left out. Off by default: it downloads.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.harness import Figure

ROOT = Path(__file__).resolve().parent.parent


def installed(lock: Path) -> tuple[float, int]:
    """(MB of site-packages without pip, number of distributions) for a venv with `lock` alone."""
    with tempfile.TemporaryDirectory(prefix="stopdesk-bench-image-") as tmp:
        subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
        python = Path(tmp) / "bin" / "python"
        site = Path(tmp) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        before = _kib(site)  # pip and its metadata, as a fresh venv has them
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", lock],
            check=True,
        )
        count = sum(1 for _ in site.glob("*.dist-info")) - 1  # pip's own
        return (_kib(site) - before) / 1024, count


def _kib(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True).stdout.split()[0])


def run() -> Iterator[Figure]:
    runtime_mb, runtime_n = installed(ROOT / "requirements.lock")
    yield Figure("image.runtime_mb", runtime_mb, "MB")
    yield Figure("image.runtime_packages", runtime_n, "distributions")
    dev_mb, dev_n = installed(ROOT / "requirements-dev.lock")
    yield Figure("image.dev_mb", dev_mb, "MB")
    yield Figure("image.dev_packages", dev_n, "distributions")
    yield Figure("image.runtime_share", runtime_mb / dev_mb, "of dev")
