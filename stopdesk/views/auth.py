"""Sign-in with rate limiting, and re-authentication for approvals.

Failed attempts are counted in Django's cache per client address and per username: five wrong
passwords in five minutes lock that address and that username out for the rest of the window.
Counting per username too stops one account being guessed from many addresses.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

REAUTH_SESSION_KEY = "stopdesk_reauth_at"


def _client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a proxy we trust sets it.
    return request.META.get("REMOTE_ADDR", "unknown")


def _keys(request: HttpRequest, username: str) -> list[str]:
    return [f"login-fail:addr:{_client_address(request)}", f"login-fail:user:{username.lower()[:150]}"]


def attempts_exceeded(request: HttpRequest, username: str) -> bool:
    limit = settings.STOPDESK_LOGIN_ATTEMPTS
    return any((cache.get(key) or 0) >= limit for key in _keys(request, username))


def attempt_failed(request: HttpRequest, username: str) -> None:
    for key in _keys(request, username):
        if not cache.add(key, 1, timeout=settings.STOPDESK_LOGIN_WINDOW_SECONDS):
            try:
                cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.add(key, 1, timeout=settings.STOPDESK_LOGIN_WINDOW_SECONDS)


def _too_many(request: HttpRequest) -> HttpResponse:
    minutes = max(1, settings.STOPDESK_LOGIN_WINDOW_SECONDS // 60)
    return render(request, "auth/too_many.html", {"minutes": minutes}, status=429)


class RateLimitedLoginView(LoginView):
    template_name = "auth/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if attempts_exceeded(request, request.POST.get("username", "")):
            return _too_many(request)
        return super().post(request, *args, **kwargs)

    # Signing in does not count as re-authentication: an approval always asks for the password
    # on its own, so walking away from a signed-in browser cannot approve anything.

    def form_invalid(self, form: Any) -> HttpResponse:
        attempt_failed(self.request, self.request.POST.get("username", ""))
        return super().form_invalid(form)


def reauthenticated_at(request: HttpRequest) -> Any:
    from datetime import UTC, datetime

    stamp = request.session.get(REAUTH_SESSION_KEY)
    return datetime.fromtimestamp(stamp, tz=UTC) if stamp else None


def reauth_fresh(request: HttpRequest) -> bool:
    stamp = request.session.get(REAUTH_SESSION_KEY)
    return stamp is not None and time.time() - stamp <= settings.STOPDESK_REAUTH_SECONDS


def reauth_check_password(request: HttpRequest, password: str) -> bool:
    """Check the signed-in person's password and stamp the session; rate-limited like sign-in."""
    username = request.user.get_username()
    if attempts_exceeded(request, username):
        return False
    if authenticate(request, username=username, password=password) is None:
        attempt_failed(request, username)
        return False
    request.session[REAUTH_SESSION_KEY] = time.time()
    return True


@login_required
def reauth(request: HttpRequest) -> HttpResponse:
    next_url = request.POST.get("next") or request.GET.get("next") or "/"
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = "/"
    error = ""
    if request.method == "POST":
        if attempts_exceeded(request, request.user.get_username()):
            return _too_many(request)
        if reauth_check_password(request, request.POST.get("password", "")):
            return redirect(next_url)
        error = "That password is not right."
    context = {"next": next_url, "error": error, "minutes": settings.STOPDESK_REAUTH_SECONDS // 60}
    return render(request, "auth/reauth.html", context, status=400 if error else 200)
