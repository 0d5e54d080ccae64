"""The README's step for a stopdesk started with `up --data-dir DIR`: a new demo runs with the same
folder in STOPDESK_DATA_DIR, and lands in that folder's database and worker queue; the same
command pointed at another folder does not reach it."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from tests.run.helpers import ROOT, clean_env, run


def _readme_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^STOPDESK_DATA_DIR=DIR \.venv/bin/python manage\.py (demo_task[^\n]*)$", text, re.M)
    assert match, "the README no longer says how to start a demo for `up --data-dir DIR`"
    return match[1].split()


def test_the_readme_demo_command_for_a_custom_data_dir_reaches_that_folder(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "other"
    assert run(["manage.py", "migrate", "--verbosity", "0"], clean_env(data), timeout=300).returncode == 0
    command = _readme_command()

    started = run(["manage.py", *command, "--pace", "0"], clean_env(data), timeout=120)
    assert started.returncode == 0, started.stderr
    assert re.search(r"demo task \d+ started", started.stdout)
    with sqlite3.connect(data / "stopdesk.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM stopdesk_task").fetchone()[0] == 1
    assert any((data / "broker").rglob("*")), "the demo's job is not in this folder's worker queue"

    elsewhere = run(["manage.py", *command, "--pace", "0"], clean_env(other), timeout=120)
    assert elsewhere.returncode != 0 and "not migrated" in elsewhere.stderr
