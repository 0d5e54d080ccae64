"""Settings, read from the environment.

With nothing set, stopdesk runs on an embedded default: SQLite in ./var and Celery on kombu's
filesystem transport, so `make run` needs no services. Under pytest, PostgreSQL and Redis on
127.0.0.1 are used when they answer, because the invariants are about PostgreSQL's behaviour.
"""

import os
import socket
import sys
from pathlib import Path

from stopdesk import config, config_file
from stopdesk.logs import logging_config
from stopdesk.sso import environment as sso_environment

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("STOPDESK_DATA_DIR", BASE_DIR / "var"))
TESTING = "pytest" in sys.modules or os.environ.get("STOPDESK_TESTING") == "1"
PRODUCTION = config.environment() == "production"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# Each of these raises config.ConfigError (one readable line, no traceback) when it is wrong.
SECRET_KEY = config.secret_key(production=PRODUCTION)
DEBUG = config.debug(production=PRODUCTION)
ALLOWED_HOSTS = config.allowed_hosts(production=PRODUCTION)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "stopdesk",
    "stopdesk.notify",
    "reconcile",
    "stopdrill",
]

MIDDLEWARE = [
    "stopdesk.chunked.ChunkedBodyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A session that came through single sign-on is re-checked at the provider once it is older
    # than STOPDESK_OIDC_SESSION_SECONDS; nothing happens while single sign-on is off.
    "stopdesk.sso.middleware.SsoRecheck",
    "stopdesk.unstorable.UnstorableInputMiddleware",
]

ROOT_URLCONF = "stopdesk.urls"
WSGI_APPLICATION = "stopdesk.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "stopdesk" / "templates"],  # first: its admin/ overrides Django's own
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "stopdesk.sso.context.sso",
            ],
        },
    },
]

_default_pg = "postgres://postgres@127.0.0.1:5432/stopdesk"
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": config.database(os.environ["DATABASE_URL"])}
elif TESTING and _reachable("127.0.0.1", 5432):
    DATABASES = {"default": config.database(_default_pg)}
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {"default": config.database(f"sqlite:///{DATA_DIR / 'stopdesk.sqlite3'}")}

_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    # IMMEDIATE makes every transaction take SQLite's write lock at BEGIN, so the boundary's
    # read-then-write (the SQLite path) is serialised against Stop.
    _db["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
elif _db["ENGINE"].endswith("postgresql"):
    # Django's backend, whose health check of a reused connection asks nothing when its socket
    # shows the server has not ended it (stopdesk/backends/postgresql).
    _db["ENGINE"] = "stopdesk.backends.postgresql"
    _db.setdefault("OPTIONS", {})
    # Statements run on server-side-binding cursors (the boundary's) are prepared after 5 runs;
    # Django's own client-binding cursors are unaffected.
    _db["OPTIONS"].setdefault("prepare_threshold", 5)
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
# Times to the second wherever a template shows a bare time (the admin): stopdesk/formats.
FORMAT_MODULE_PATH = ["stopdesk.formats"]

STATIC_URL = "static/"
# whitenoise serves STATIC_ROOT, filled by collectstatic (the image does it at build time); in
# development and tests there is none and it serves straight from the finders.
STATIC_ROOT = os.environ.get("STOPDESK_STATIC_ROOT") or (str(DATA_DIR / "staticfiles") if PRODUCTION else None)
WHITENOISE_USE_FINDERS = DEBUG or TESTING

# Local accounts always; single sign-on through an OpenID Connect provider beside them when
# STOPDESK_OIDC_ISSUER is set (stopdesk/sso, README "Single sign-on"). Its backend answers only the
# provider's callback, so password sign-in (and the Django admin's) is untouched.
STOPDESK_OIDC = sso_environment.from_environment()
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "stopdesk.sso.backend.SsoBackend"]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# Pages: no inline script or style anywhere, htmx and CSS served from static/ (no CDN).
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
    "base-uri": ["'none'"],
    "object-src": ["'none'"],
}
SECURE_CSP["form-action"] += sso_environment.form_origins(STOPDESK_OIDC)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = os.environ.get("STOPDESK_SSL_REDIRECT", "1") == "1"
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # health checks come over plain HTTP from inside
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = config.integer("STOPDESK_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Preloading is a promise to browsers that every subdomain serves HTTPS for years; only the
    # site's owner can make it (STOPDESK_HSTS_PRELOAD=1). Without it Django's deploy check warns
    # (security.W021); that warning is silenced on purpose (see the README).
    SECURE_HSTS_PRELOAD = config.boolean("STOPDESK_HSTS_PRELOAD", False)
    SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
    SESSION_COOKIE_AGE = 8 * 3600
    CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# Sign-in: this many failed attempts for one username from one client address within the window
# lock that pair out for the rest of the window; one address gets STOPDESK_LOGIN_ADDRESS_ATTEMPTS
# failures in all. Approving a compensation needs a password entered this recently.
STOPDESK_LOGIN_ATTEMPTS = config.integer("STOPDESK_LOGIN_ATTEMPTS", 5)
STOPDESK_LOGIN_ADDRESS_ATTEMPTS = config.integer("STOPDESK_LOGIN_ADDRESS_ATTEMPTS", 20)
# Proxies (addresses or networks) whose X-Forwarded-For is believed for the client address.
STOPDESK_TRUSTED_PROXIES = config.networks("STOPDESK_TRUSTED_PROXIES")
STOPDESK_LOGIN_WINDOW_SECONDS = config.integer("STOPDESK_LOGIN_WINDOW_SECONDS", 300)
STOPDESK_REAUTH_SECONDS = config.integer("STOPDESK_REAUTH_SECONDS", 300)

# Celery. The broker is Redis when configured (or reachable under tests); otherwise kombu's
# filesystem transport, so a real worker process runs with no broker installed.
_default_redis = "redis://127.0.0.1:6379/0"
if os.environ.get("CELERY_BROKER_URL"):
    CELERY_BROKER_URL = config.broker_url(os.environ["CELERY_BROKER_URL"])
elif TESTING and _reachable("127.0.0.1", 6379):
    CELERY_BROKER_URL = os.environ.get("STOPDESK_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
else:
    CELERY_BROKER_URL = "filesystem://localhost//"  # a host name, or kombu warns on every connection
    _queue_dir = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(DATA_DIR / "broker-processed"),
        "store_processed": False,
        # Fan-out exchanges (revoke broadcasts) are kept here; the default is ./control in the cwd.
        "control_folder": str(DATA_DIR / "broker-control"),
    }
    # Every process that talks to the folder broker (web, worker, a shell) needs them to exist.
    for _folder in (_queue_dir, DATA_DIR / "broker-processed", DATA_DIR / "broker-control"):
        _folder.mkdir(parents=True, exist_ok=True)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 15 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 14 * 60
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The demo agent (stopdrill/demo) is not a module Celery's autodiscovery finds; its tasks are registered here.
CELERY_IMPORTS = ("stopdrill.demo.agent",)
CELERY_BEAT_SCHEDULE = {
    "reap-stale-items": {"task": "stopdesk.reap_stale_items", "schedule": 30.0},
    "resume-stop-fanouts": {"task": "stopdesk.resume_stop_fanouts", "schedule": 30.0},
    "purge-api-replays": {"task": "stopdesk.purge_api_replays", "schedule": 3600.0},
    # The audit table's monthly partitions, created months ahead (stopdesk/services/partitions.py).
    "ensure-event-partitions": {"task": "stopdesk.ensure_event_partitions", "schedule": 6 * 3600.0},
    # The audit chain, sealed after commit: events written since the last run get their place
    # and hash (stopdesk/services/audit_seal.py). Until then they are listed as not sealed yet.
    "seal-audit-events": {"task": "stopdesk.seal_audit_events", "schedule": 5.0},
    # Tasks whose items have all settled but whose settle check after commit never ran (the
    # process died) or raced (stopdesk/services/transitions/settled.py).
    "settle-tasks": {"task": "stopdesk.settle_tasks", "schedule": 60.0},
    # Open tasks idle past STOPDESK_TASK_IDLE_CLOSE_MINUTES are closed (stopdesk/services/closing.py).
    "close-idle-tasks": {"task": "stopdesk.close_idle_tasks", "schedule": 60.0},
    # Bounded batch of items awaiting reconciliation or due for a re-check (reconcile/services).
    "reconcile-sweep": {"task": "reconcile.sweep", "schedule": 5.0},
    # Approved compensations whose job was lost are queued again; ones whose worker died mid-run
    # are escalated (reconcile/services/compensation.py).
    "compensation-sweep": {"task": "reconcile.sweep_compensations", "schedule": 60.0},
    # Notifications: deadlines near or passed, stops not settled, lost jobs and due retries
    # (stopdesk/notify); the worker heartbeat and the background half of /metrics.
    "notify-sweep": {"task": "notify.sweep", "schedule": 10.0},
    "worker-heartbeat": {"task": "notify.heartbeat", "schedule": 15.0},
    "metrics-tally": {"task": "notify.metrics_tally", "schedule": 30.0},
}
# Per-mechanism timing (timeouts, deadline, backoff, re-check window after cancelled); the
# defaults live in each adapter (reconcile/mechanisms/), these override them. Deadline, call
# timeout and watch window come from STOPDESK_<MECHANISM>_{DEADLINE,CALL_TIMEOUT,WATCH}_SECONDS.
STOPDESK_MECHANISMS: dict[str, dict] = {name: dict(values) for name, values in config.mechanism_timings().items()}
STOPDESK_MECHANISMS.setdefault("openai", {})["options"] = {
    "base_url": os.environ.get("OPENAI_BASE_URL", ""),
    "api_key": os.environ.get("OPENAI_API_KEY", ""),
}

# OpenAI's webhooks (POST /hooks/openai, reconcile/views_webhooks.py): the endpoint's signing
# secret from OpenAI's dashboard (whsec_...). Unset, the endpoint answers 503 and stopdesk polls.
# Set, they wake a read-back at once, so the openai mechanism's polling, now only the fallback,
# is slower unless its timings are set: a still-running response is read again after 30 s, not
# 5 s, and a `cancelled` is first re-read for a flip after 60 s.
STOPDESK_OPENAI_WEBHOOK_SECRET = os.environ.get("OPENAI_WEBHOOK_SECRET", "").strip()
if STOPDESK_OPENAI_WEBHOOK_SECRET:
    STOPDESK_MECHANISMS["openai"].setdefault("recheck_interval_s", 30.0)
    STOPDESK_MECHANISMS["openai"].setdefault("watch_first_s", 60.0)

# Where agents watch for Stop: the watch server (docs/OPERATIONS.md, "Where watches go"). Set, the
# web door answers its watch path at once with this address; empty, it serves watches itself.
STOPDESK_WATCH_URL = config.watch_url()

# The ledger's own knobs.
STOPDESK = {
    # A running item whose heartbeat is older than this is presumed lost and reconciled.
    "LEASE_SECONDS": config.integer("STOPDESK_LEASE_SECONDS", 60),
    "HEARTBEAT_SECONDS": config.integer("STOPDESK_HEARTBEAT_SECONDS", 10),
    # Stop's batched canceller holds its items for this long and renews the hold while it works,
    # so the items of a canceller that dies are due to the sweep again within this time
    # (reconcile/services/lease.py).
    "RECONCILE_LEASE_SECONDS": config.integer("STOPDESK_RECONCILE_LEASE_SECONDS", 20),
    "INVESTIGATE_BY_HOURS": config.integer("STOPDESK_INVESTIGATE_BY_HOURS", 24),
    # An open task with no new work this long (settled that long ago, or no item since it was
    # created) is closed by the idle-close sweep; until then it keeps its Stop (services/closing.py).
    "TASK_IDLE_CLOSE_MINUTES": config.integer("STOPDESK_TASK_IDLE_CLOSE_MINUTES", 60),
    # Whether every commit that records an outcome (a framework run's tool results and drafts, a
    # notification's delivery result) waits for PostgreSQL to flush it to disk. On by default;
    # STOPDESK_DURABLE_RESULTS=0 trades that for speed: a crash of the database server may then
    # lose the last such commits (docs/OPERATIONS.md, "Durable results").
    "DURABLE_RESULTS": config.boolean("STOPDESK_DURABLE_RESULTS", True),
}

# The audit chain's anchors outside the database (docs/AUDIT.md, "Anchored outside the database").
# Each seal signs the chain heads it moved with an Ed25519 key (STOPDESK_AUDIT_SIGNING_KEY, PEM or
# base64 of the 32-byte seed, or STOPDESK_AUDIT_SIGNING_KEY_FILE) and appends them to a file a day
# in ANCHORS_DIR. With neither set, a key is generated once at DEV_KEY_FILE, with a warning.
STOPDESK_AUDIT = {
    "SIGNING_KEY": os.environ.get("STOPDESK_AUDIT_SIGNING_KEY", ""),
    "SIGNING_KEY_FILE": os.environ.get("STOPDESK_AUDIT_SIGNING_KEY_FILE", ""),
    "DEV_KEY_FILE": str(DATA_DIR / "audit-signing-key.pem"),
    "ANCHORS_DIR": os.environ.get("STOPDESK_AUDIT_ANCHORS_DIR") or str(DATA_DIR / "audit-anchors"),
}

# Notifications (stopdesk/notify): who hears what is chosen per person (defaults by role); the
# webhook endpoints are rows edited in the admin.
STOPDESK_NOTIFY = {
    "BASE_URL": os.environ.get("STOPDESK_BASE_URL", "http://localhost:8000"),
    # In production, email is on once a mail server is configured (EMAIL_HOST).
    "EMAIL": os.environ.get("STOPDESK_NOTIFY_EMAIL", "1" if os.environ.get("EMAIL_HOST") or not PRODUCTION else "0")
    == "1",
    "INVESTIGATE_NEAR_MINUTES": float(os.environ.get("STOPDESK_INVESTIGATE_NEAR_MINUTES", "120")),
    "STOP_UNSETTLED_MINUTES": float(os.environ.get("STOPDESK_STOP_UNSETTLED_MINUTES", "30")),
    "TIMEOUT_SECONDS": float(os.environ.get("STOPDESK_WEBHOOK_TIMEOUT_SECONDS", "10")),
    # A sender holds a delivery this long; past it, a sender presumed dead is replaced.
    "CLAIM_SECONDS": float(os.environ.get("STOPDESK_NOTIFY_CLAIM_SECONDS", "60")),
    "RETRY_BASE_SECONDS": float(os.environ.get("STOPDESK_NOTIFY_RETRY_BASE_SECONDS", "30")),
    "RETRY_MAX_SECONDS": float(os.environ.get("STOPDESK_NOTIFY_RETRY_MAX_SECONDS", "3600")),
    "MAX_ATTEMPTS": int(os.environ.get("STOPDESK_NOTIFY_MAX_ATTEMPTS", "8")),
    # A notification without deliveries this long after it was written lost its job.
    "LOST_JOB_SECONDS": float(os.environ.get("STOPDESK_NOTIFY_LOST_JOB_SECONDS", "30")),
    # Per-item alerts of a task are gathered into a digest: its first message after this window,
    # then one when the task settles, and meanwhile at most one update per repeat interval.
    "DIGEST_WINDOW_SECONDS": float(os.environ.get("STOPDESK_NOTIFY_DIGEST_WINDOW_SECONDS", "60")),
    "DIGEST_REPEAT_MINUTES": float(os.environ.get("STOPDESK_NOTIFY_DIGEST_REPEAT_MINUTES", "30")),
}
# Mail (Django's MAILERS): the console backend prints notifications into the log unless an SMTP
# host is set.
if os.environ.get("EMAIL_HOST"):
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": os.environ["EMAIL_HOST"],
                "port": int(os.environ.get("EMAIL_PORT", "587")),
                "username": os.environ.get("EMAIL_HOST_USER", ""),
                "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
                "use_tls": os.environ.get("EMAIL_USE_TLS", "1") == "1",
                "timeout": 20,
            },
        }
    }
elif PRODUCTION:
    # No mail server configured: email notifications are off (STOPDESK_NOTIFY_EMAIL below).
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend"}}
else:
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "stopdesk@localhost")

# /metrics answers only this bearer token; unset, it is off (404).
STOPDESK_METRICS_TOKEN = os.environ.get("STOPDESK_METRICS_TOKEN", "")
# Readiness: a worker or beat heartbeat older than this counts as down.
STOPDESK_READY_MAX_AGE_SECONDS = float(os.environ.get("STOPDESK_READY_MAX_AGE_SECONDS", "120"))

# External systems, by name (`ExternalRecord.system`, an http item's `"system"`): one generic
# declaration each for the HTTP adapter (reconcile/mechanisms/http/adapter.py), which reads records back,
# looks operations up and runs approved compensations with them. Relative URLs join `base_url`.
# The sandbox CRM versions records as an integer and takes it back in If-Match as `"v<version>"`;
# the mail outbox offers no reversal, so a sent message can only be reported.
STOPDESK_MECHANISMS.setdefault("http", {}).setdefault("options", {})["systems"] = {
    "crm": {
        "base_url": os.environ.get("STOPDESK_CRM_URL", "http://127.0.0.1:8765"),
        "lookup_url": "/records?idempotency_key={idempotency_key}",
        "record_url": "/records/{record_id}",
        "version_field": "version",
        "reverse": {
            "action": "archive",
            "label": "Archive the record",
            "url": "/records/{record_id}/archive",
            "if_match": '"v{version}"',
        },
    },
    "outbox": {
        "base_url": os.environ.get("STOPDESK_OUTBOX_URL", "http://127.0.0.1:8766"),
        "lookup_url": "/messages?idempotency_key={idempotency_key}",
        "record_url": "/messages/{record_id}",
    },
}

# STOPDESK_CONFIG_FILE (stopdesk/config_file.py): named MCP servers, external systems and mechanism
# options from a TOML file, over the values above; the STOPDESK_<MECHANISM>_* timing variables win.
if config_file.path():
    STOPDESK_MECHANISMS = config_file.merged(
        STOPDESK_MECHANISMS, str(config_file.path()), environment=config.mechanism_timings()
    )

# The MCP tool server the demo agent calls (the sandbox's, under `manage.py up`).
STOPDESK_MCP_URL = os.environ.get("STOPDESK_MCP_URL", "http://127.0.0.1:8764/mcp")

# Tool readiness (reconcile/readiness.py): "enforce" refuses to register an item for a tool that
# cannot account for its submitted work (no status lookup, or a failed latest drill); "warn" logs it.
STOPDESK_READINESS_POLICY = os.environ.get("STOPDESK_READINESS_POLICY", "off")

# The sign-in rate limit counts in this cache, which every web process must share: the database
# by default (its table is made by a migration), Redis when STOPDESK_CACHE_URL is set.
if os.environ.get("STOPDESK_CACHE_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["STOPDESK_CACHE_URL"],
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "stopdesk_cache"}}

# One line per record with the task and item it is about: JSON in production, key=value here.
LOGGING = logging_config(production=PRODUCTION, level=config.log_level())
