"""The configured provider: its settings (settings.STOPDESK_OIDC), its discovery document, and
the answers mozilla-django-oidc's `get_settings` asks for.

The provider's endpoints come from its discovery document, read when first needed and kept for
DISCOVERY_SECONDS, never at start-up: a provider that is down must not stop local sign-in, and a
page that needs it says what is wrong (ProviderUnavailable) instead of failing with a 500.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from django.conf import settings
from mozilla_django_oidc.utils import import_from_settings

DISCOVERY_SECONDS = 3600
TIMEOUT_SECONDS = 10
CALLBACK = "sso-callback"
BACKEND = "stopdesk.sso.backend.SsoBackend"
_REQUIRED = ("authorization_endpoint", "token_endpoint", "jwks_uri")

_lock = threading.Lock()
_documents: dict[str, tuple[float, dict[str, Any]]] = {}


class ProviderUnavailable(Exception):
    """The provider's configuration could not be read or does not fit; the message says so plainly."""


def conf() -> dict[str, Any]:
    return dict(getattr(settings, "STOPDESK_OIDC", {}) or {})


def enabled() -> bool:
    return bool(conf())


def name() -> str:
    return str(conf().get("name") or "single sign-on")


def discovery() -> dict[str, Any]:
    """The provider's openid-configuration (cached), checked as OpenID Connect Discovery asks."""
    c = conf()
    issuer = c["issuer"]
    with _lock:
        cached = _documents.get(issuer)
        if cached and time.monotonic() - cached[0] < DISCOVERY_SECONDS:
            return cached[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = httpx.get(url, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        raise ProviderUnavailable(
            f"stopdesk could not reach the provider at {url} ({type(exc).__name__}). Check STOPDESK_OIDC_ISSUER "
            "and that this server can reach the provider."
        ) from exc
    if response.status_code != 200:
        raise ProviderUnavailable(
            f"The provider answered HTTP {response.status_code} at {url}, where its OpenID configuration "
            "should be. Check STOPDESK_OIDC_ISSUER (for Keycloak it ends in /realms/<realm>)."
        )
    try:
        document = response.json()
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"What {url} answered is not an OpenID configuration (not a JSON object).")
    if str(document.get("issuer", "")).rstrip("/") != issuer:
        raise ProviderUnavailable(
            f"The provider at {url} names itself {document.get('issuer')!r}, not {issuer!r}: "
            "STOPDESK_OIDC_ISSUER must be exactly the provider's issuer."
        )
    absent = [key for key in _REQUIRED if not document.get(key)]
    if absent:
        raise ProviderUnavailable(f"The provider's OpenID configuration at {url} lacks {', '.join(absent)}.")
    # Endpoints named in STOPDESK_OIDC["endpoints"] win over the document's (a provider reached
    # through a gateway of one's own, or a test's man in the middle).
    document = {**document, **c.get("endpoints", {})}
    with _lock:
        _documents[issuer] = (time.monotonic(), document)
    return document


def forget_discovery() -> None:
    with _lock:
        _documents.clear()


def end_session_endpoint() -> str:
    try:
        return str(discovery().get("end_session_endpoint") or "")
    except ProviderUnavailable:
        return ""


_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


def setting(attr: str, *default: Any) -> Any:
    """What mozilla-django-oidc reads from Django's settings, answered from STOPDESK_OIDC."""
    c = conf()
    if attr in _ENDPOINTS:
        return discovery().get(_ENDPOINTS[attr]) or (default[0] if default else None)
    fixed: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": c.get("client_id"),
        "OIDC_RP_CLIENT_SECRET": c.get("client_secret"),
        "OIDC_RP_SIGN_ALGO": c.get("sign_algo", "RS256"),
        "OIDC_RP_IDP_SIGN_KEY": None,
        "OIDC_RP_SCOPES": c.get("scopes", "openid email profile"),
        "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": c.get("session_seconds", 300),
        "OIDC_AUTHENTICATION_CALLBACK_URL": CALLBACK,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_STORE_ID_TOKEN": True,  # the logout's id_token_hint
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_TOKEN_USE_BASIC_AUTH": True,  # client_secret_basic: every provider's default
        "OIDC_TIMEOUT": TIMEOUT_SECONDS,
        "OIDC_VERIFY_SSL": True,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "OIDC_VERIFY_KID": True,
        "OIDC_CREATE_USER": True,
        "OIDC_AUTH_REQUEST_EXTRA_PARAMS": {},
        "OIDC_EXEMPT_URLS": [],
        "LOGIN_REDIRECT_URL_FAILURE": settings.LOGIN_URL,
    }
    if attr in fixed:
        return fixed[attr]
    return import_from_settings(attr, *default)
