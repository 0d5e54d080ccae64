"""Sign-in through the provider, its callback, the provider-confirmed re-authentication an approval
needs, and a logout that also ends the provider's session. Every failure is a page that says what
happened and what to do, with the way back to a local sign-in; none of it is a 500."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from stopdesk.sso import provider
from stopdesk.sso.backend import SignInRefused
from stopdesk.views.auth import REAUTH_SESSION_KEY

REAUTH_PENDING = "stopdesk_sso_reauth"
# A provider's clock and ours may differ a little; an auth_time this far ahead still counts.
CLOCK_SKEW_SECONDS = 30
_SILENT_ERRORS = {"login_required", "interaction_required", "consent_required", "account_selection_required"}


def sso_session(request: HttpRequest) -> bool:
    """The person signed in through the provider (not with a password here)."""
    return bool(getattr(request, "session", None)) and request.session.get(BACKEND_SESSION_KEY) == provider.BACKEND


def problem(request: HttpRequest, title: str, message: str, status: int) -> HttpResponse:
    context = {"title": title, "message": message, "provider": provider.name()}
    return render(request, "sso/problem.html", context, status=status)


class _Start(OIDCAuthenticationRequestView):
    get_settings = staticmethod(provider.setting)
    extra: dict[str, str] = {}

    def get_extra_params(self, request: HttpRequest) -> dict[str, str]:
        return dict(self.extra)


class _Confirm(_Start):
    # OpenID Connect Core 3.1.2.1: prompt=login asks the provider to authenticate the person again,
    # max_age=0 that the returned token's auth_time be from now; the callback checks it is.
    extra = {"prompt": "login", "max_age": "0"}


def _redirect_to_provider(view: type[_Start], request: HttpRequest) -> HttpResponse:
    if not provider.enabled():
        raise Http404("Single sign-on is not configured.")
    try:
        return view.as_view()(request)  # type: ignore[no-any-return]
    except provider.ProviderUnavailable as exc:
        return problem(request, "Single sign-on is not working", str(exc), 503)


def start(request: HttpRequest) -> HttpResponse:
    return _redirect_to_provider(_Start, request)


def _state(response: HttpResponse) -> str:
    query = parse_qs(urlsplit(response.get("Location", "")).query)
    return (query.get("state") or [""])[0]


@login_required
def reauth(request: HttpRequest) -> HttpResponse:
    """Send the person to the provider to sign in again; the callback counts it for approvals."""
    next_url = request.GET.get("next") or "/"
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = "/"
    if not sso_session(request):
        return HttpResponseRedirect(f"{reverse('reauth')}?{urlencode({'next': next_url})}")
    response = _redirect_to_provider(_Confirm, request)
    if response.status_code == 302:
        request.session[REAUTH_PENDING] = {
            "state": _state(response),
            "user": request.user.pk,
            "at": time.time(),
            "next": next_url,
        }
    return response


class _Callback(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(provider.setting)
    confirming: dict[str, Any] | None = None

    def login_failure(self) -> HttpResponse:
        return problem(
            self.request,
            "Sign-in did not complete",
            f"{provider.name()} did not sign you in to stopdesk. Try again from the sign-in page.",
            403,
        )

    def login_success(self) -> HttpResponse:
        pending = self.confirming
        if pending is None:
            return super().login_success()  # type: ignore[no-any-return]
        # A confirmation for an approval: the same person, and a sign-in from after it was asked.
        self.request.session.pop(REAUTH_PENDING, None)
        token = getattr(self.request, "stopdesk_sso_token", {}) or {}
        auth_time = token.get("auth_time")
        if self.user.pk != pending["user"] or self.user.pk != self.request.user.pk:
            auth.logout(self.request)
            return problem(
                self.request,
                "Confirmed as someone else",
                f"{provider.name()} confirmed a different person than the one signed in here, so stopdesk signed "
                "you out. Sign in again as yourself.",
                403,
            )
        if not isinstance(auth_time, int | float) or not (
            pending["at"] - CLOCK_SKEW_SECONDS <= auth_time <= time.time() + CLOCK_SKEW_SECONDS
        ):
            return problem(
                self.request,
                "Your sign-in was not confirmed",
                f"{provider.name()} did not ask for your sign-in again (its answer says you last signed in "
                f"{'at an unknown time' if auth_time is None else 'earlier'}), so it does not count for an "
                "approval. Try again; if it keeps happening, an admin should check the provider honours "
                "prompt=login and max_age.",
                403,
            )
        self.request.session[REAUTH_SESSION_KEY] = float(auth_time)
        self.request.session["oidc_id_token_expiration"] = time.time() + provider.conf()["session_seconds"]
        return HttpResponseRedirect(pending["next"])

    def get(self, request: HttpRequest) -> HttpResponse:
        pending = request.session.get(REAUTH_PENDING)
        state = request.GET.get("state")
        self.confirming = pending if pending and state and pending.get("state") == state else None
        error = request.GET.get("error")
        if error and self.confirming is not None:
            # A confirmation the person cancelled or the provider refused: nothing is approved, and
            # the session goes on as it was (its own re-check is the middleware's).
            request.session.pop(REAUTH_PENDING, None)
            states = request.session.get("oidc_states", {})
            states.pop(state, None)
            request.session["oidc_states"] = states
            return problem(
                request,
                "Your sign-in was not confirmed",
                f"{provider.name()} answered {error}; nothing was approved. Go back and confirm again.",
                403,
            )
        if error:
            was_signed_in = request.user.is_authenticated
            super().get(request)  # drops the state and signs out, as the library does
            if error in _SILENT_ERRORS and was_signed_in:
                messages.info(request, f"Your sign-in at {provider.name()} has ended. Sign in again.")
                return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
            description = request.GET.get("error_description", "")
            return problem(
                request,
                "Sign-in did not complete",
                f"{provider.name()} answered {error}" + (f": {description}" if description else "") + ".",
                403,
            )
        try:
            return super().get(request)  # type: ignore[no-any-return]
        except SignInRefused as exc:
            # Fail closed: whatever this was (a sign-in, a re-check, a confirmation), the session ends.
            if request.user.is_authenticated:
                auth.logout(request)
            return problem(request, exc.title, exc.message, exc.status)


def callback(request: HttpRequest) -> HttpResponse:
    if not provider.enabled():
        raise Http404("Single sign-on is not configured.")
    return _Callback.as_view()(request)  # type: ignore[no-any-return]


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    """Ends the stopdesk session; for a person who came through the provider, also asks the
    provider to end its session (RP-initiated logout), so the next sign-in asks for a password."""
    through_provider = provider.enabled() and sso_session(request)
    id_token = request.session.get("oidc_id_token", "")
    auth.logout(request)
    login_url = request.build_absolute_uri(resolve_url(settings.LOGOUT_REDIRECT_URL))
    end_session = provider.end_session_endpoint() if through_provider else ""
    if not end_session:
        return HttpResponseRedirect(login_url)
    params = {"client_id": provider.conf()["client_id"], "post_logout_redirect_uri": login_url}
    if id_token:
        params["id_token_hint"] = id_token
    return HttpResponseRedirect(f"{end_session}?{urlencode(params)}")
