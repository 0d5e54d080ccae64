"""Per-runtime bearer tokens: the door reads the request's header; the check is the runtime
service's (`stopdesk.services.runtimes.runtime_for`)."""

from __future__ import annotations

from django.http import HttpRequest

from stopdesk.models import Runtime
from stopdesk.services.runtimes import runtime_for


def authenticate(request: HttpRequest) -> Runtime:
    return runtime_for(request.headers.get("Authorization", ""))
