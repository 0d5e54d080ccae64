"""Settings, read from the environment.

With nothing set, stopdesk runs on an embedded default: SQLite in ./var and Celery on kombu's
filesystem transport, so `make run` needs no services. Under pytest, PostgreSQL and Redis on
127.0.0.1 are used when they answer, because the invariants are about PostgreSQL's behaviour.
"""

import os
import socket
import sys
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("STOPDESK_DATA_DIR", BASE_DIR / "var"))
TESTING = "pytest" in sys.modules or os.environ.get("STOPDESK_TESTING") == "1"
PRODUCTION = os.environ.get("STOPDESK_ENV") == "production"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


SECRET_KEY = os.environ.get("SECRET_KEY") or "dev-only-insecure-key-not-for-production"
DEBUG = os.environ.get("DEBUG", "0" if PRODUCTION else "1") == "1"
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "stopdesk",
    "reconcile",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "stopdesk.urls"
WSGI_APPLICATION = "stopdesk.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_default_pg = "postgres://postgres@127.0.0.1:5432/stopdesk"
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
elif TESTING and _reachable("127.0.0.1", 5432):
    DATABASES = {"default": dj_database_url.parse(_default_pg)}
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {"default": dj_database_url.parse(f"sqlite:///{DATA_DIR / 'stopdesk.sqlite3'}")}

_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    # IMMEDIATE makes every transaction take SQLite's write lock at BEGIN, so the boundary's
    # read-then-write (the SQLite path) is serialised against Stop.
    _db["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
elif _db["ENGINE"].endswith("postgresql"):
    _db.setdefault("OPTIONS", {})
    if os.environ.get("STOPDESK_DB_POOL") == "1":
        _db["OPTIONS"]["pool"] = {"min_size": 2, "max_size": 20}
    else:
        _db["CONN_MAX_AGE"] = 60
        _db["CONN_HEALTH_CHECKS"] = True
    _db.setdefault("TEST", {})
    if os.environ.get("STOPDESK_TEST_DB_NAME"):
        _db["TEST"]["NAME"] = os.environ["STOPDESK_TEST_DB_NAME"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

# Celery. The broker is Redis when configured (or reachable under tests); otherwise kombu's
# filesystem transport, so a real worker process runs with no broker installed.
_default_redis = "redis://127.0.0.1:6379/0"
if os.environ.get("CELERY_BROKER_URL"):
    CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
elif TESTING and _reachable("127.0.0.1", 6379):
    CELERY_BROKER_URL = os.environ.get("STOPDESK_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
else:
    CELERY_BROKER_URL = "filesystem://"
    _queue_dir = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(DATA_DIR / "broker-processed"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 15 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 14 * 60
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "reap-stale-items": {"task": "stopdesk.reap_stale_items", "schedule": 30.0},
}

# The ledger's own knobs.
STOPDESK = {
    # A running item whose heartbeat is older than this is presumed lost and reconciled.
    "LEASE_SECONDS": int(os.environ.get("STOPDESK_LEASE_SECONDS", "60")),
    "HEARTBEAT_SECONDS": int(os.environ.get("STOPDESK_HEARTBEAT_SECONDS", "10")),
    "INVESTIGATE_BY_HOURS": int(os.environ.get("STOPDESK_INVESTIGATE_BY_HOURS", "24")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}
