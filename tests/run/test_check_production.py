"""`python -m stopdesk check` in production mode refuses unsafe settings, each with one line."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.run.helpers import ROOT, clean_env, run
from tests.run.test_config_errors import PREFIX, one_line

GOOD_KEY = secrets.token_urlsafe(50)


@pytest.fixture
def prod(tmp_path: Path) -> dict[str, str]:
    env = clean_env(
        tmp_path,
        STOPDESK_ENV="production",
        SECRET_KEY=GOOD_KEY,
        ALLOWED_HOSTS="stopdesk.example.com",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/4",
    )
    # Set by the browser tests' Playwright fixture in this process; never in a deployment.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env


def check(env: dict[str, str]) -> str:
    return one_line(run(["-m", "stopdesk", "check"], env))


def test_a_sound_production_configuration_passes_check_and_the_deploy_checks(prod: dict[str, str]) -> None:
    result = run(["-m", "stopdesk", "check"], prod)
    assert result.returncode == 0 and "configuration ok" in result.stdout, result.stderr
    deploy = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], prod)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    assert "no issues" in deploy.stdout


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("dev-only-insecure-key-not-for-production", "development key"),
        ("a" * 40, "SECRET_KEY"),
        ("ab" * 40, "too few different characters"),
        ("django-insecure-" + secrets.token_urlsafe(50), "development key"),
    ],
)
def test_an_unsafe_secret_key_is_refused(prod: dict[str, str], key: str, says: str) -> None:
    prod["SECRET_KEY"] = key
    line = check(prod)
    assert line.startswith(PREFIX + "SECRET_KEY") and says in line and key not in line


@pytest.mark.parametrize("value", ["1", "true", "True", "yes"])
def test_debug_on_in_production_is_refused(prod: dict[str, str], value: str) -> None:
    prod["DEBUG"] = value
    assert check(prod).startswith(PREFIX + "DEBUG")


def test_debug_with_a_value_that_is_not_a_boolean_is_refused(prod: dict[str, str]) -> None:
    prod["DEBUG"] = "maybe"
    assert check(prod).startswith(PREFIX + "DEBUG")


@pytest.mark.parametrize("hosts", ["*", "stopdesk.example.com,*", ".example.com,*"])
def test_a_wildcard_allowed_host_in_production_is_refused(prod: dict[str, str], hosts: str) -> None:
    prod["ALLOWED_HOSTS"] = hosts
    assert check(prod).startswith(PREFIX + "ALLOWED_HOSTS")


@pytest.mark.parametrize("value", ["prod", "Production", "staging", "dev"])
def test_stopdesk_env_accepts_only_its_documented_values(prod: dict[str, str], value: str) -> None:
    prod["STOPDESK_ENV"] = value
    line = check(prod)
    assert line.startswith(PREFIX + "STOPDESK_ENV") and "development" in line and "production" in line


def test_a_log_level_that_is_not_one_is_one_line(prod: dict[str, str]) -> None:
    prod["LOG_LEVEL"] = "LOUD"
    line = check(prod)
    assert line.startswith(PREFIX + "LOG_LEVEL") and "DEBUG, INFO, WARNING, ERROR, CRITICAL" in line


@pytest.mark.parametrize("name", ["WORKER_CONCURRENCY", "WEB_CONCURRENCY", "PORT", "STOPDESK_LOGIN_ATTEMPTS"])
def test_a_number_that_is_not_one_is_refused(prod: dict[str, str], name: str) -> None:
    prod[name] = "abc"
    assert check(prod).startswith(PREFIX + name)


def test_a_relative_sqlite_path_is_refused_and_no_file_is_created(prod: dict[str, str]) -> None:
    prod["DATABASE_URL"] = "sqlite:///i13-relative-check.sqlite3"
    line = check(prod)
    assert line.startswith(PREFIX + "DATABASE_URL") and "absolute" in line
    assert not (ROOT / "i13-relative-check.sqlite3").exists()


def test_check_does_not_create_a_missing_sqlite_database(prod: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "nowhere" / "stopdesk.sqlite3"
    prod["DATABASE_URL"] = f"sqlite:///{target}"
    line = check(prod)
    assert "does not exist" in line and "migrate" in line
    assert not target.exists()


def test_the_development_key_is_still_fine_outside_production(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    result = run(["-m", "stopdesk", "check"], env)
    assert result.returncode == 0, result.stderr
