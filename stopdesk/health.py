"""`GET /healthz`: does this process reach the database and the broker? JSON, 200 or 503.

No login and no session: load balancers, compose and Kubernetes call it. Each check is bounded
(the broker's by a short connect timeout), so a dead dependency makes the answer 503, not a hang.
"""

from __future__ import annotations

import time

from django.db import connection
from django.db.utils import Error
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from stopdesk.config import check_broker


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
