"""The fixed cast and the shared fixtures. External parties are real servers on 127.0.0.1."""

from __future__ import annotations

import os
import shutil

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.backends.signals import connection_created

from tests import state_guard

REQUIRE_SERVICES = os.environ.get("STOPDESK_REQUIRE_SERVICES") == "1"


def _on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def _on_redis() -> bool:
    return settings.CELERY_BROKER_URL.startswith("redis://")


_AVAILABLE = {
    "postgres": "reachable on 127.0.0.1",
    "redis": "reachable on 127.0.0.1",
    "reference_servers": "installed (`make test` installs them where npm is: apt-get install nodejs npm)",
    "browser": "installed at /usr/bin/chromium (apt-get install chromium)",
    "oidc_provider": "installed (`make test` installs it where npm is: apt-get install nodejs npm)",
    "crewai": "installed (`make test` builds it: make crewai-venv)",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.frameworks_venvs import crewai_missing
    from tests.oidc_provider import missing as oidc_provider_missing
    from tests.reference_servers import missing as reference_servers_missing

    missing = {
        "postgres": not _on_postgres(),
        "redis": not _on_redis(),
        "reference_servers": bool(reference_servers_missing()),
        # Debian's Chromium, which tests/browser/conftest.py launches; Playwright's own download is never used.
        "browser": not shutil.which("/usr/bin/chromium"),
        "oidc_provider": bool(oidc_provider_missing()),
        "crewai": crewai_missing(),
    }
    for item in items:
        for marker, absent in missing.items():
            if absent and item.get_closest_marker(marker):
                if REQUIRE_SERVICES:
                    # In CI nothing that matters may be skipped.
                    raise pytest.UsageError(f"{item.nodeid} needs {marker}, which is not {_AVAILABLE[marker]}")
                item.add_marker(pytest.mark.skip(reason=f"{marker} is not {_AVAILABLE[marker]}"))


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_audit_triggers():
    """Transactional tests end with Django's flush (TRUNCATE on PostgreSQL, DELETE on SQLite), which
    the audit triggers refuse. Wiping a test database is what only its owner may do, so the flush
    does it as an owner would: with the triggers off for that one statement batch."""
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper
    from django.db.backends.sqlite3.base import DatabaseWrapper as SqliteWrapper

    Postgres, Sqlite = PostgresWrapper.ops_class, SqliteWrapper.ops_class

    originals = {Postgres: Postgres.execute_sql_flush, Sqlite: Sqlite.execute_sql_flush}

    def postgres_flush(self, sql_list):  # type: ignore[no-untyped-def]
        with self.connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
        try:
            originals[Postgres](self, sql_list)
        finally:
            with self.connection.cursor() as cursor:
                cursor.execute("RESET session_replication_role")

    def sqlite_flush(self, sql_list):  # type: ignore[no-untyped-def]
        raw = self.connection.connection
        raw.create_function("stopdesk_audit_guard", 0, lambda: 0)
        try:
            originals[Sqlite](self, sql_list)
        finally:
            raw.create_function("stopdesk_audit_guard", 0, lambda: 1)

    Postgres.execute_sql_flush = postgres_flush  # type: ignore[method-assign]
    Sqlite.execute_sql_flush = sqlite_flush  # type: ignore[method-assign]
    yield
    Postgres.execute_sql_flush = originals[Postgres]  # type: ignore[method-assign]
    Sqlite.execute_sql_flush = originals[Sqlite]  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def _state_writes_guarded():
    """Every connection any test opens, in any thread, runs its SQL past the state guard
    (tests/state_guard.py): a state written outside its machine's one writer fails the test."""
    connection_created.connect(state_guard.install, dispatch_uid="tests.state_guard")
    for conn in connections.all(initialized_only=True):
        state_guard.install(conn)
    yield
    connection_created.disconnect(dispatch_uid="tests.state_guard")


@pytest.fixture(autouse=True)
def _no_state_written_outside_its_writer():
    """Also what a thread, or code that swallows the guard's error, ran into during the test."""
    state_guard.take_found()
    yield
    found = state_guard.take_found()
    assert not found, "state written outside its writer:\n" + "\n".join(found)


@pytest.fixture(autouse=True)
def audit_anchors(settings, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Each test's seals sign with a key of its own and anchor into a directory of its own."""
    where = tmp_path_factory.mktemp("audit")
    settings.STOPDESK_AUDIT = {
        "SIGNING_KEY": "",
        "SIGNING_KEY_FILE": "",
        "DEV_KEY_FILE": str(where / "signing-key.pem"),
        "ANCHORS_DIR": str(where / "anchors"),
    }
    return where


@pytest.fixture
def cast(db):  # type: ignore[no-untyped-def]
    """operator (may stop), reviewer, approver, second approver, admin."""
    from django.contrib.auth.models import User

    people = {}
    for name in ("operator", "reviewer", "approver", "approver2"):
        people[name] = User.objects.create_user(name, f"{name}@example.test", password=f"{name}-pass-123")
    people["admin"] = User.objects.create_superuser("admin", "admin@example.test", password="admin-pass-123")
    return people


@pytest.fixture
def pg_dsn(transactional_db) -> str:  # type: ignore[no-untyped-def]
    """A libpq DSN for the test database, for subprocesses (workers) that must share it."""
    db = connection.settings_dict
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):  # type: ignore[no-untyped-def]
    """pytest-django's, plus: close the stop listeners', watch threads', framework runs' threads' and
    the agent door's threads' connections before the test database is dropped (they live in threads that outlast the tests)."""
    yield
    from stopdesk.agent.frameworks.lanes import close_connections as close_run_connections
    from stopdesk.api.agent_door import close_django_threads
    from stopdesk.push.hub import stop_hub_close
    from stopdesk.push.watch import close_connections

    stop_hub_close()
    close_connections()
    close_run_connections()
    close_django_threads()
