"""The re-check: a session that came through the provider lasts STOPDESK_OIDC_SESSION_SECONDS;
the first request after that goes back to the provider with `prompt=none` (mozilla-django-oidc's
SessionRefresh), and the callback sets the roles again from the new token, or ends the session when
the provider no longer signs the person in.

The library re-checks only GET requests. Here every request of an expired session is held: a POST
(a Stop, an approval) never runs on roles older than the lifetime, and an htmx request is told to
load its page again as a whole, which then goes through the provider like any page.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import auth
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect
from mozilla_django_oidc.middleware import SessionRefresh

from stopdesk.sso import provider
from stopdesk.sso.views import problem

_DEFAULTS: dict[str, Any] = {"OIDC_STATE_SIZE": 32, "OIDC_NONCE_SIZE": 32}


class SsoRecheck(SessionRefresh):
    get_settings = staticmethod(provider.setting)

    def __init__(self, get_response: Any) -> None:
        # Not SessionRefresh.__init__: it reads the provider's endpoints at start-up. They are read
        # when a re-check needs them (__getattr__), so a provider that is down stops no process.
        MiddlewareMixin.__init__(self, get_response)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("OIDC_"):
            return provider.setting(name, *([_DEFAULTS[name]] if name in _DEFAULTS else []))
        raise AttributeError(name)

    @property
    def exempt_urls(self) -> set[str]:  # type: ignore[override]
        return {reverse("sso-login"), reverse("sso-callback"), reverse("sso-reauth"), reverse("logout")}

    def is_refreshable_url(self, request: HttpRequest) -> bool:
        return (
            provider.enabled()
            and _came_through_provider(request)
            and request.path not in self.exempt_urls
            and not request.path.startswith("/static/")
        )

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not provider.enabled() and _came_through_provider(request):
            # Single sign-on was turned off: nobody can re-check this session's roles any more.
            auth.logout(request)
            return redirect_to_login(request.get_full_path())
        if not self.is_refreshable_url(request):
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        if getattr(request, "htmx", False):
            # htmx follows a redirect inside its request, and a provider's page cannot load there.
            return HttpResponseClientRedirect(_page(request, request.headers.get("HX-Current-URL", "")))
        try:
            response = super().process_request(request)
        except provider.ProviderUnavailable as exc:
            # Fail closed: without the provider's word, the roles are not renewed.
            return problem(request, "Your sign-in could not be checked", str(exc), 503)
        if request.method not in ("GET", "HEAD") and response is not None:
            # The form's action is not a page to come back to; the page it was sent from is.
            request.session["oidc_login_next"] = _page(request, request.headers.get("Referer", ""))
            return HttpResponseRedirect(response["Location"], status=303)
        return response  # type: ignore[no-any-return]


def _came_through_provider(request: HttpRequest) -> bool:
    return request.user.is_authenticated and request.session.get(BACKEND_SESSION_KEY) == provider.BACKEND


def _page(request: HttpRequest, url: str) -> str:
    if url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}):
        return url
    return "/"
