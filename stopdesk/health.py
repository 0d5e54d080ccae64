"""`GET /healthz`: does this process reach the database and the broker? JSON, 200 or 503.
`GET /readyz`: that, and are a worker and beat alive (their heartbeat rows' ages)?

No login and no session: load balancers, compose and Kubernetes call it. Each check is bounded
(the broker's by a short connect timeout), so a dead dependency makes the answer 503, not a hang.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection
from django.db.utils import Error
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from stopdesk.config import check_broker
from stopdesk.notify.heartbeat import BEAT, WORKER, heartbeat_ages


def _database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict[str, object]] = {}
    for name, check in (("database", _database), ("broker", lambda: check_broker(timeout_s=2.0))):
        started = time.monotonic()
        problem = check()
        checks[name] = {"ok": problem is None, "ms": round((time.monotonic() - started) * 1000, 1)}
        if problem:
            checks[name]["error"] = problem
    ok = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)


def processes_ready(components: tuple[str, ...] = (BEAT, WORKER)) -> dict[str, dict[str, object]]:
    """Each component's heartbeat age and whether it is within STOPDESK_READY_MAX_AGE_SECONDS."""
    limit = settings.STOPDESK_READY_MAX_AGE_SECONDS
    found: dict[str, dict[str, object]] = {}
    for name, age in heartbeat_ages(components).items():
        found[name] = {"ok": age is not None and age <= limit, "age_s": None if age is None else round(age, 1)}
    return found


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to do the work: database and broker answer, and a worker and beat showed life
    recently (heartbeat rows, ages in seconds). `?component=worker` checks one."""
    wanted = tuple(c for c in request.GET.get("component", "").split(",") if c) or (BEAT, WORKER)
    if set(wanted) - {BEAT, WORKER}:
        return JsonResponse({"error": "component must be worker or beat", "field": "component"}, status=400)
    checks: dict[str, dict[str, object]] = {}
    problem = _database()
    checks["database"] = {"ok": problem is None, **({"error": problem} if problem else {})}
    if problem is None:
        checks.update(processes_ready(wanted))
    ok = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ready" if ok else "not ready", "checks": checks}, status=200 if ok else 503)
