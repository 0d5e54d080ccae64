"""A command a user is told to run, on a database that was never migrated (a fresh clone before
`make run`), answers with one line saying what to do: no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.run.helpers import clean_env, run

COMMANDS = [
    ["stopdrill", "--brief", "--no-store"],
    ["stopdrill"],
    ["demo_task", "--pace", "0"],
    ["create_runtime_token", "invoices-agent"],
    ["revoke_runtime_token", "invoices-agent"],
    ["create_demo_users"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_command_before_migrate_says_to_migrate_in_one_line(tmp_path: Path, command: list[str]) -> None:
    result = run(["manage.py", *command], clean_env(tmp_path), timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert "not migrated" in lines[0] and "manage.py migrate" in lines[0], lines[0]


def test_an_unreachable_database_is_one_line_too(tmp_path: Path) -> None:
    env = clean_env(tmp_path, DATABASE_URL="postgres://stopdesk:secret@127.0.0.1:1/stopdesk")
    result = run(["manage.py", "create_runtime_token", "x"], env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert "cannot reach the database" in lines[0] and "secret" not in lines[0]
