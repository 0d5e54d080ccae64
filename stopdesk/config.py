"""Configuration from the environment, and the checks that turn a bad one into one readable line.

Settings call the parsers below; a mistake raises `ConfigError`, a `SystemExit` whose message names
what to fix, so `manage.py`, gunicorn and Celery exit with that line instead of a traceback.
`preflight()` is the start-up check that the database and the broker answer: `manage.py up`,
`python -m stopdesk web|worker|beat` and the compose services run it before anything else.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from reconcile.mechanisms.folders import FOLDERS

PREFIX = "stopdesk: configuration error: "
DATABASE_SCHEMES = ("postgres", "postgresql", "pgsql", "sqlite")
BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp", "filesystem", "memory", "sentinel")
MIN_SECRET_KEY = 50  # Django's own deploy check (security.W009) asks for 50
MIN_SECRET_KEY_CHARACTERS = 10  # distinct characters: "aaaa…" or "abab…" is long but guessable
DEV_SECRET_KEY = "dev-only-insecure-key-not-for-production"  # noqa: S105 - public on purpose; refused in production
ENVIRONMENTS = ("development", "production")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


class ConfigError(SystemExit):
    """Exit status 1 and one line on stderr: Python prints an uncaught SystemExit's message as it is."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(PREFIX + message)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if _port(parts) else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _port(parts: Any) -> int | None:
    try:
        return parts.port  # type: ignore[no-any-return]
    except ValueError:
        return None


def environment() -> str:
    """STOPDESK_ENV: development (the default) or production. Anything else is refused: a typo
    such as `prod` must not quietly mean development."""
    value = os.environ.get("STOPDESK_ENV", "") or "development"
    if value not in ENVIRONMENTS:
        raise ConfigError(f"STOPDESK_ENV={value!r} is not one of: {', '.join(ENVIRONMENTS)}.")
    return value


def secret_key(*, production: bool) -> str:
    value = os.environ.get("SECRET_KEY", "")
    how = 'e.g. from `python -c "import secrets; print(secrets.token_urlsafe(50))"`'
    if production and not value:
        raise ConfigError(
            f"SECRET_KEY is not set; production mode (STOPDESK_ENV=production) needs a random key of 50 characters, {how}."
        )
    if production and (value == DEV_SECRET_KEY or value.startswith("django-insecure-")):
        raise ConfigError(
            f"SECRET_KEY is a development key that anyone can read; production mode needs its own, {how}."
        )
    if production and len(value) < MIN_SECRET_KEY:
        raise ConfigError(
            f"SECRET_KEY is {len(value)} characters long; production mode needs at least {MIN_SECRET_KEY}, {how}."
        )
    if production and len(set(value)) < MIN_SECRET_KEY_CHARACTERS:
        raise ConfigError(
            f"SECRET_KEY has too few different characters ({len(set(value))}) to be random; production mode needs a random key, {how}."
        )
    return value or DEV_SECRET_KEY


def boolean(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a yes/no value; use 1 or 0.")


def debug(*, production: bool) -> bool:
    on = boolean("DEBUG", not production)
    if production and on:
        raise ConfigError(
            "DEBUG is on in production mode; it shows settings and code to visitors. Unset DEBUG or set DEBUG=0."
        )
    return on


def integer(name: str, default: int, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number from the environment, within bounds, or one line naming the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number.") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name}={value} must be at least {minimum}{upper}.")
    return value


def bind_host() -> str:
    """STOPDESK_BIND_HOST: where `python -m stopdesk web` listens. Loopback unless told otherwise;
    the container image sets 0.0.0.0, because there the port is published by the container."""
    raw = os.environ.get("STOPDESK_BIND_HOST", "").strip() or "127.0.0.1"
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", raw):
            raise ConfigError(
                f"STOPDESK_BIND_HOST={raw!r} is not an address to listen on; use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)."
            ) from None
    return raw


def watch_url() -> str:
    """STOPDESK_WATCH_URL: the address agents reach the watch server at (`python -m stopdesk watch`),
    e.g. http://stopdesk.example:8001. Set, the web door sends every watch there at once instead of
    holding a thread for it; empty, the web door serves watches itself (one thread each)."""
    raw = os.environ.get("STOPDESK_WATCH_URL", "").strip().rstrip("/")
    if not raw:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"STOPDESK_WATCH_URL={raw!r} is not the watch server's address; use e.g. http://stopdesk.example:8001."
        )
    return raw.removesuffix("/api/v1")


def networks(name: str) -> list[str]:
    """Comma-separated addresses or networks (10.0.0.0/8), each checked."""
    found = []
    for part in (p.strip() for p in os.environ.get(name, "").split(",")):
        if not part:
            continue
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise ConfigError(
                f"{name}: {part!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/8)."
            ) from None
        found.append(part)
    return found


def log_level() -> str:
    raw = os.environ.get("LOG_LEVEL", "WARNING")
    if raw.strip().upper() not in LOG_LEVELS:
        raise ConfigError(f"LOG_LEVEL={raw!r} is not a log level; use one of {', '.join(LOG_LEVELS)}.")
    return raw.strip().upper()


# Per-mechanism timing from the environment: STOPDESK_<MECHANISM>_<WHAT>. The names of the
# mechanisms are the folders' (reconcile/mechanisms/folders.py, plain Python, so settings can read it).
MECHANISMS = tuple(FOLDERS)
MECHANISM_TIMINGS = {
    "DEADLINE_SECONDS": "deadline_s",  # from the cancel request to `uncertain`
    "CALL_TIMEOUT_SECONDS": "call_timeout_s",  # one remote call
    "WATCH_SECONDS": "recheck_after_cancelled_s",  # keep watching a `cancelled` for a flip
    "WATCH_FIRST_SECONDS": "watch_first_s",  # the watch's first read-back after the cancel
    "WATCH_GROWTH": "watch_growth",  # each later read-back's interval, times the one before
}
_TIMING = re.compile(r"STOPDESK_([A-Z0-9]+)_(" + "|".join(MECHANISM_TIMINGS) + r")")


def timing_variable(mechanism: str, field_name: str) -> str:
    what = next(k for k, v in MECHANISM_TIMINGS.items() if v == field_name)
    return f"STOPDESK_{mechanism.upper()}_{what}"


def mechanism_timings() -> dict[str, dict[str, float]]:
    """The STOPDESK_<MECHANISM>_{DEADLINE,CALL_TIMEOUT,WATCH,WATCH_FIRST}_SECONDS and
    _WATCH_GROWTH variables that are set, as overrides for settings.STOPDESK_MECHANISMS. A watch
    window may be 0, a growth must be at least 1 (a factor, not seconds); the others must be > 0."""
    found: dict[str, dict[str, float]] = {}
    for name in sorted(os.environ):
        match = _TIMING.fullmatch(name)
        if not match:
            continue
        mechanism, what = match[1].lower(), match[2]
        if mechanism not in MECHANISMS:
            raise ConfigError(
                f"{name}: there is no mechanism called {mechanism!r}; use one of {', '.join(MECHANISMS)}."
            )
        raw = os.environ[name]
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            unit = "a factor" if what == "WATCH_GROWTH" else "a number of seconds"
            raise ConfigError(f"{name}={raw!r} is not {unit}.")
        if what == "WATCH_GROWTH":
            if value < 1:
                raise ConfigError(
                    f"{name}={raw} must be at least 1 (each read-back waits at least as long as the last)."
                )
        elif what == "WATCH_SECONDS" and value < 0:
            raise ConfigError(f"{name}={raw} must be at least 0.")
        elif what != "WATCH_SECONDS" and value <= 0:
            raise ConfigError(f"{name}={raw} must be more than 0.")
        found.setdefault(mechanism, {})[MECHANISM_TIMINGS[what]] = value
    return found


def allowed_hosts(*, production: bool) -> list[str]:
    default = "" if production else "127.0.0.1,localhost,testserver"
    hosts = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", default).split(",") if h.strip()]
    if production and not hosts:
        raise ConfigError(
            "ALLOWED_HOSTS is not set; production mode needs the host names the site is served on, comma-separated (e.g. ALLOWED_HOSTS=stopdesk.example.com)."
        )
    if production and "*" in hosts:
        raise ConfigError(
            "ALLOWED_HOSTS contains *, which accepts any Host header (password-reset links and caches can then be poisoned); name the hosts the site is served on."
        )
    return hosts


def database(url: str) -> dict[str, Any]:
    """Parse DATABASE_URL: postgres://USER:PASSWORD@HOST:5432/NAME, or sqlite:////ABSOLUTE/PATH."""
    import dj_database_url

    expected = "postgres://USER:PASSWORD@HOST:5432/NAME or sqlite:////ABSOLUTE/PATH"
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in DATABASE_SCHEMES:
        raise ConfigError(f"DATABASE_URL {redact(url)!r} is not a database URL stopdesk can use; expected {expected}.")
    try:
        config = dict(dj_database_url.parse(url))
    except ValueError:
        raise ConfigError(
            f"DATABASE_URL {redact(url)!r} cannot be parsed (is the port a number, the password URL-quoted?); expected {expected}."
        ) from None
    if not config.get("NAME"):
        raise ConfigError(f"DATABASE_URL {redact(url)!r} names no database; expected {expected}.")
    name = str(config["NAME"])
    if scheme == "sqlite" and name != ":memory:" and not os.path.isabs(name):
        raise ConfigError(
            f"DATABASE_URL {redact(url)!r} is a relative SQLite path, which depends on the folder a process starts in; use an absolute one, sqlite:////ABSOLUTE/PATH."
        )
    return config


def broker_url(url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme.split("+", 1)[0] not in BROKER_SCHEMES:
        raise ConfigError(
            f"CELERY_BROKER_URL {redact(url)!r} is not a broker URL; expected redis://HOST:6379/0 or amqp://USER:PASSWORD@HOST:5672//."
        )
    return url


# --- start-up: do the database and the broker answer? -------------------------------------------


def check_database(timeout_s: float = 5.0, *, create: bool = False) -> str | None:
    """None when the database answers, else one line saying what to fix. SQLite creates a missing
    file on connect: for a DATABASE_URL the operator named, only `migrate` (create=True) may do
    that, a check must not. (The embedded default lives in stopdesk's own data folder.)"""
    from django.conf import settings
    from django.db import connections
    from django.db.utils import Error

    db = settings.DATABASES["default"]
    where = _where(db)
    conn = connections["default"]
    sqlite_file = str(db["NAME"])
    named = bool(os.environ.get("DATABASE_URL"))
    if (
        db["ENGINE"].endswith("sqlite3")
        and named
        and not create
        and sqlite_file != ":memory:"
        and not os.path.exists(sqlite_file)
    ):
        return f"the SQLite database {sqlite_file} does not exist; create it with `python -m stopdesk migrate` (or `python manage.py migrate`)."
    if db["ENGINE"].endswith("postgresql"):
        # A refused or black-holed port fails fast here; libpq's own timeout is per address.
        host, port = db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)
        if not host.startswith("/") and (error := _tcp(host, port, timeout_s)):
            return f"cannot reach the database at {where} ({error}); check DATABASE_URL and that PostgreSQL is running."
    try:
        conn.ensure_connection()
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot use the database at {where} ({reason}); check DATABASE_URL."
    finally:
        conn.close()
    return None


def require_migrated_database() -> None:
    """For the commands a user is told to run: raise CommandError (one line) when the database cannot
    be reached or is not migrated, so a fresh clone (never migrated) or a database that does not
    answer gets one line saying what to do instead of a traceback."""
    from django.core.management.base import CommandError
    from django.db import DEFAULT_DB_ALIAS, connections
    from django.db.migrations.executor import MigrationExecutor
    from django.db.utils import Error

    connection = connections[DEFAULT_DB_ALIAS]
    # An open connection (a caller's transaction, as under call_command in tests) already answered;
    # the reachability check closes its connection, so it runs only before the first one.
    if connection.connection is None and (problem := check_database()):
        raise CommandError(problem)
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Error as exc:
        raise CommandError(f"cannot read the database's migrations ({str(exc).strip().splitlines()[0]}).") from None
    if pending:
        where = describe_database(connection.settings_dict)
        raise CommandError(
            f"the database at {where} is not migrated ({len(pending)} migration(s) to apply); "
            "run `python manage.py migrate` first (`make run` does it for you)."
        )


def check_broker(timeout_s: float = 5.0) -> str | None:
    """None when the Celery broker accepts a connection, else one line saying what to fix."""
    from django.conf import settings

    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        folders: dict[str, Any] = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        for key in ("data_folder_in", "data_folder_out", "processed_folder"):
            try:
                os.makedirs(str(folders[key]), exist_ok=True)
            except OSError as exc:
                return f"cannot create the local broker folder {folders[key]} ({exc.strerror}); set STOPDESK_DATA_DIR to a writable folder."
        return None
    # In the body: settings import this module, and the Celery app is needed only for this check.
    from stopdesk.celery import app

    try:
        with app.connection_for_write(url) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_s)
    except Exception as exc:  # kombu raises the transport's own errors; all mean "not reachable"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot reach the Celery broker at {redact(url)} ({reason}); check CELERY_BROKER_URL and that the broker is running."
    return None


def preflight(*, database: bool = True, broker: bool = True, create: bool = False) -> None:
    """Raise ConfigError with the first problem found. `create`: a missing SQLite file may be made."""
    if database and (problem := check_database(create=create)):
        raise ConfigError(problem)
    if broker and (problem := check_broker()):
        raise ConfigError(problem)


def describe_database(db: dict[str, Any]) -> str:
    """Where the database is, without its password, for one-line messages."""
    return _where(db)


def _where(db: dict[str, Any]) -> str:
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    return f"postgres://{user + '@' if user else ''}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db.get('NAME')}"


def _tcp(host: str, port: int, timeout_s: float) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror:
        return f"unknown host {host!r}"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout_s:.0f}s"
    except OSError as exc:
        return f"{exc.strerror or type(exc).__name__} at {host}:{port}"


def fail(message: str) -> None:
    """Print one configuration line and exit, for entry points that are not inside settings."""
    print(PREFIX + message, file=sys.stderr)
    raise SystemExit(2)
