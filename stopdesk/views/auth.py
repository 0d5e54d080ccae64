"""Sign-in with rate limiting, and re-authentication for approvals.

Failed sign-ins are counted in Django's cache (the database by default, so every web process
shares one count) per (username, client address): five wrong passwords in five minutes lock that
pair for the rest of the window. Counting the pair, not the username alone, means a stranger
guessing an approver's password locks out only themselves. A ceiling per address
(STOPDESK_LOGIN_ADDRESS_ATTEMPTS) stops one address trying many accounts. Approval
re-authentication counts on its own, per signed-in person: only someone holding that person's
session can spend it, and a locked sign-in does not block an approval or the other way round.

The client address is REMOTE_ADDR, or, when that is a proxy named in STOPDESK_TRUSTED_PROXIES,
the nearest address in X-Forwarded-For that is not one of those proxies: a client can prepend
anything to the header, but only the hops our own proxies added are believed.
"""

from __future__ import annotations

import ipaddress
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


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net, strict=False) for net in settings.STOPDESK_TRUSTED_PROXIES)


def client_address(request: HttpRequest) -> str:
    remote = str(request.META.get("REMOTE_ADDR", "unknown"))
    if not settings.STOPDESK_TRUSTED_PROXIES or not _trusted(remote):
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop):
            return hop[:64]
    return remote


def _login_limits(request: HttpRequest, username: str) -> list[tuple[str, int]]:
    address = client_address(request)
    return [
        (f"login-fail:pair:{address}:{username.lower()[:150]}", settings.STOPDESK_LOGIN_ATTEMPTS),
        (f"login-fail:addr:{address}", settings.STOPDESK_LOGIN_ADDRESS_ATTEMPTS),
    ]


def _reauth_limits(username: str) -> list[tuple[str, int]]:
    return [(f"reauth-fail:user:{username.lower()[:150]}", settings.STOPDESK_LOGIN_ATTEMPTS)]


def _exceeded(limits: list[tuple[str, int]]) -> bool:
    return any((cache.get(key) or 0) >= limit for key, limit in limits)


def _count(limits: list[tuple[str, int]]) -> None:
    for key, _limit in limits:
        if not cache.add(key, 1, timeout=settings.STOPDESK_LOGIN_WINDOW_SECONDS):
            try:
                cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.add(key, 1, timeout=settings.STOPDESK_LOGIN_WINDOW_SECONDS)


def attempts_exceeded(request: HttpRequest, username: str) -> bool:
    return _exceeded(_login_limits(request, username))


def attempt_failed(request: HttpRequest, username: str) -> None:
    _count(_login_limits(request, username))


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
    if _exceeded(_reauth_limits(username)):
        return False
    if authenticate(request, username=username, password=password) is None:
        _count(_reauth_limits(username))
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
        if _exceeded(_reauth_limits(request.user.get_username())):
            return _too_many(request)
        if reauth_check_password(request, request.POST.get("password", "")):
            return redirect(next_url)
        error = "That password is not right."
    context = {"next": next_url, "error": error, "minutes": settings.STOPDESK_REAUTH_SECONDS // 60}
    return render(request, "auth/reauth.html", context, status=400 if error else 200)
