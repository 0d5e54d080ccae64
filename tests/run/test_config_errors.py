"""A bad configuration gives one readable line naming what to fix, not a traceback."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.run.helpers import clean_env, run

PREFIX = "stopdesk: configuration error: "


def one_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(PREFIX)
    return lines[0]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path)


def test_production_without_secret_key_names_secret_key(env: dict[str, str]) -> None:
    env.update(STOPDESK_ENV="production", ALLOWED_HOSTS="stopdesk.example.com")
    line = one_line(run(["manage.py", "check"], env))
    assert "SECRET_KEY is not set" in line and "STOPDESK_ENV=production" in line


def test_production_with_a_short_secret_key_says_how_long_it_must_be(env: dict[str, str]) -> None:
    env.update(STOPDESK_ENV="production", ALLOWED_HOSTS="stopdesk.example.com", SECRET_KEY="short")
    assert "at least 50" in one_line(run(["manage.py", "check"], env))


def test_production_without_allowed_hosts_names_allowed_hosts(env: dict[str, str]) -> None:
    env.update(STOPDESK_ENV="production", SECRET_KEY=secrets.token_urlsafe(50))
    assert "ALLOWED_HOSTS is not set" in one_line(run(["manage.py", "check"], env))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://root@db/stopdesk", "is not a database URL stopdesk can use"),
        ("postgres://stopdesk:secret@db:notaport/stopdesk", "cannot be parsed"),
        ("postgres://stopdesk@db:5432", "names no database"),
        ("localhost:5432/stopdesk", "is not a database URL"),
    ],
)
def test_a_bad_database_url_names_database_url(env: dict[str, str], url: str, says: str) -> None:
    env["DATABASE_URL"] = url
    line = one_line(run(["manage.py", "check"], env))
    assert line.startswith(PREFIX + "DATABASE_URL") and says in line
    assert "secret" not in line, "the password is never printed"


def test_a_bad_broker_url_names_celery_broker_url(env: dict[str, str]) -> None:
    env["CELERY_BROKER_URL"] = "localhost:6379"
    assert one_line(run(["manage.py", "check"], env)).startswith(PREFIX + "CELERY_BROKER_URL")


def test_an_unreachable_database_at_start_up_names_database_url(env: dict[str, str]) -> None:
    env["DATABASE_URL"] = "postgres://stopdesk:secret@127.0.0.1:1/stopdesk"
    for command in (["-m", "stopdesk", "check"], ["-m", "stopdesk", "web"], ["manage.py", "up", "--port", "0"]):
        line = one_line(run(command, env))
        assert "cannot reach the database at postgres://stopdesk@127.0.0.1:1/stopdesk" in line, command
        assert "check DATABASE_URL" in line and "secret" not in line


def test_a_database_that_does_not_exist_names_database_url(env: dict[str, str]) -> None:
    env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/stopdesk_no_such_database"
    result = run(["-m", "stopdesk", "check"], env)
    if "cannot reach" in result.stderr:
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    line = one_line(result)
    assert "stopdesk_no_such_database" in line and "does not exist" in line and "check DATABASE_URL" in line


def test_an_unreachable_broker_at_start_up_names_celery_broker_url(env: dict[str, str]) -> None:
    env["CELERY_BROKER_URL"] = "redis://127.0.0.1:1/0"
    for command in (["-m", "stopdesk", "check"], ["-m", "stopdesk", "worker"], ["manage.py", "up", "--port", "0"]):
        line = one_line(run(command, env))
        assert "cannot reach the Celery broker at redis://127.0.0.1:1/0" in line, command
        assert "check CELERY_BROKER_URL" in line


def test_a_good_configuration_says_so(env: dict[str, str]) -> None:
    result = run(["-m", "stopdesk", "check"], env)
    assert result.returncode == 0, result.stderr
    assert "configuration ok" in result.stdout


@pytest.mark.parametrize("url", ["localhost:8001", "ftp://watch.example", "http://watch.example:8001/?x=1"])
def test_a_bad_watch_url_names_stopdesk_watch_url(env: dict[str, str], url: str) -> None:
    env["STOPDESK_WATCH_URL"] = url
    line = one_line(run(["manage.py", "check"], env))
    assert line.startswith(PREFIX + "STOPDESK_WATCH_URL") and "watch server's address" in line


def test_single_sign_on_without_its_role_mapping_says_how_to_write_one(env: dict[str, str]) -> None:
    env.update(
        STOPDESK_OIDC_ISSUER="https://sso.example.com/realms/acme",
        STOPDESK_OIDC_CLIENT_ID="stopdesk",
        STOPDESK_OIDC_CLIENT_SECRET="s3cret",
    )
    line = one_line(run(["manage.py", "check"], env))
    assert "STOPDESK_OIDC_ROLES is empty" in line and "approver=" in line
    assert "s3cret" not in line
