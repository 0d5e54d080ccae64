"""What the pages need to know about single sign-on: whether it is on, the provider's name, and
whether this person came through it (then approvals confirm at the provider, not with a password)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from stopdesk.sso import provider
from stopdesk.sso.views import sso_session


def sso(request: HttpRequest) -> dict[str, Any]:
    on = provider.enabled()
    return {"sso": {"enabled": on, "name": provider.name() if on else "", "session": on and sso_session(request)}}
