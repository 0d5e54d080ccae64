"""Each mechanism's deadline, call timeout and watch window come from the environment
(STOPDESK_<MECHANISM>_DEADLINE_SECONDS, _CALL_TIMEOUT_SECONDS, _WATCH_SECONDS, and the watch's
schedule: _WATCH_FIRST_SECONDS, _WATCH_GROWTH), checked by `check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.run.helpers import clean_env, run
from tests.run.test_config_errors import PREFIX, one_line

READ = (
    "from reconcile.mechanisms.registry import mechanism_settings as m; s = m('openai'); h = m('http');"
    "print(s.deadline_s, s.call_timeout_s, s.recheck_after_cancelled_s, h.deadline_s, s.watch_first_s, s.watch_growth,"
    " h.watch_growth)"
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path)


def test_the_environment_sets_a_mechanisms_deadline_timeout_and_watch_window(env: dict[str, str]) -> None:
    env.update(
        STOPDESK_OPENAI_DEADLINE_SECONDS="120",
        STOPDESK_OPENAI_CALL_TIMEOUT_SECONDS="2.5",
        STOPDESK_OPENAI_WATCH_SECONDS="0",
        STOPDESK_OPENAI_WATCH_FIRST_SECONDS="2",
        STOPDESK_OPENAI_WATCH_GROWTH="1.5",
    )
    result = run(["manage.py", "shell", "-v", "0", "-c", READ], env)
    assert result.returncode == 0, result.stderr
    # http keeps its own defaults
    assert result.stdout.split() == ["120.0", "2.5", "0.0", "600.0", "2.0", "1.5", "3.0"]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("STOPDESK_OPENAI_DEADLINE_SECONDS", "abc", "is not a number of seconds"),
        ("STOPDESK_MCP_CALL_TIMEOUT_SECONDS", "0", "must be more than 0"),
        ("STOPDESK_HTTP_WATCH_SECONDS", "-5", "must be at least 0"),
        ("STOPDESK_CELERY_DEADLINE_SECONDS", "nan", "is not a number of seconds"),
        ("STOPDESK_OPNEAI_DEADLINE_SECONDS", "60", "no mechanism called 'opneai'"),
        ("STOPDESK_OPENAI_WATCH_GROWTH", "0.5", "must be at least 1"),
        ("STOPDESK_OPENAI_WATCH_GROWTH", "fast", "is not a factor"),
        ("STOPDESK_MCP_WATCH_FIRST_SECONDS", "0", "must be more than 0"),
    ],
)
def test_a_bad_timing_is_one_line_naming_the_variable(env: dict[str, str], name: str, value: str, says: str) -> None:
    env[name] = value
    line = one_line(run(["-m", "stopdesk", "check"], env))
    assert line.startswith(PREFIX + name) and says in line


def test_check_refuses_a_call_timeout_longer_than_the_deadline(env: dict[str, str]) -> None:
    env["STOPDESK_HTTP_CALL_TIMEOUT_SECONDS"] = "900"  # http's deadline stays 600
    line = one_line(run(["-m", "stopdesk", "check"], env))
    assert "STOPDESK_HTTP_CALL_TIMEOUT_SECONDS" in line and "STOPDESK_HTTP_DEADLINE_SECONDS" in line


def test_the_known_mechanisms_are_the_registered_ones() -> None:
    from reconcile.mechanisms import registry
    from stopdesk import config

    assert set(config.MECHANISMS) == set(registry.names())
