"""The authentication backend: mozilla-django-oidc's code flow (token exchange, the ID token's
signature against the provider's keys, nonce, PKCE), with what it leaves to its users: the ID
token's issuer, audience and lifetime, the person's account and their roles from the group claim.

A person is found by the configured username claim. Single sign-on never signs into an account
that has a password here (a local account, such as a local admin): that account's owner is whoever
knows the password, not whoever the provider calls by the same name.
"""

from __future__ import annotations

from typing import Any

import jwt
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from stopdesk.permissions import roles_ensure
from stopdesk.sso import provider
from stopdesk.sso.environment import ROLES


class SignInRefused(Exception):
    """A sign-in that did not complete, with what a person reads about it."""

    def __init__(self, title: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.title = title
        self.message = message
        self.status = status


def _untrusted(why: str) -> SignInRefused:
    return SignInRefused(
        "That sign-in could not be trusted",
        f"stopdesk refused the answer from {provider.name()}: {why}. Nothing was signed in. Try again; if it "
        "happens again, an admin should check the provider's settings.",
    )


def claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name, or a dotted path into nested claims (Keycloak's `realm_access.roles`)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def roles_from(claims: dict[str, Any], conf: dict[str, Any]) -> set[str]:
    groups = claim(claims, conf["groups_claim"])
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list):
        return set()
    held = {str(g) for g in groups}
    return {role for role, names in conf["roles"].items() if held.intersection(names)}


class SsoBackend(OIDCAuthenticationBackend):
    get_settings = staticmethod(provider.setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the provider's endpoints, and Django asks every
        # backend about every password sign-in too; a provider that is down must not block those.
        self.UserModel = get_user_model()
        self.request = None

    # The library reads these as attributes; they come from STOPDESK_OIDC and discovery when used.
    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: provider.setting("OIDC_OP_TOKEN_ENDPOINT"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: provider.setting("OIDC_OP_USER_ENDPOINT"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: provider.setting("OIDC_OP_JWKS_ENDPOINT"))
    OIDC_RP_CLIENT_ID = property(lambda self: provider.setting("OIDC_RP_CLIENT_ID"))
    OIDC_RP_CLIENT_SECRET = property(lambda self: provider.setting("OIDC_RP_CLIENT_SECRET"))
    OIDC_RP_SIGN_ALGO = property(lambda self: provider.setting("OIDC_RP_SIGN_ALGO"))
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        # Only the callback passes a nonce; a password sign-in is none of this backend's business.
        if request is None or "nonce" not in kwargs or not provider.enabled():
            return None
        try:
            return super().authenticate(request, **kwargs)
        except provider.ProviderUnavailable as exc:
            raise SignInRefused("Single sign-on is not working", str(exc), status=503) from exc
        except requests.HTTPError as exc:
            raise SignInRefused("Single sign-on is not working", _token_refusal(exc.response), status=502) from exc
        except requests.RequestException as exc:
            raise SignInRefused(
                "Single sign-on is not working",
                f"stopdesk could not reach {provider.name()} to finish the sign-in ({type(exc).__name__}).",
                status=502,
            ) from exc

    def verify_token(self, token: Any, **kwargs: Any) -> Any:
        if not token:
            raise _untrusted("its answer had no ID token")
        try:
            payload = super().verify_token(token, **kwargs)
        except jwt.ExpiredSignatureError as exc:
            raise _untrusted("its ID token has expired") from exc
        except jwt.InvalidTokenError as exc:
            raise _untrusted(f"its ID token is not valid ({exc})") from exc
        except SuspiciousOperation as exc:
            # The library's words for a bad signature, an unknown key, another algorithm or nonce.
            raise _untrusted(f"its ID token did not verify ({exc})") from exc
        conf = provider.conf()
        if str(payload.get("iss", "")).rstrip("/") != conf["issuer"]:
            raise _untrusted(f"its ID token was issued by {payload.get('iss')!r}, not by {conf['issuer']!r}")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if conf["client_id"] not in audiences:
            raise _untrusted("its ID token was issued for another application")
        if len(audiences) > 1 and payload.get("azp") not in (None, conf["client_id"]):
            raise _untrusted("its ID token was issued to another application")
        for required in ("sub", "exp", "iat"):
            if required not in payload:
                raise _untrusted(f"its ID token has no {required!r}")
        if self.request is not None:
            self.request.stopdesk_sso_token = payload
        return payload

    def get_userinfo(self, access_token: Any, id_token: Any, payload: Any) -> dict[str, Any]:
        """The ID token's claims, with what userinfo adds (Keycloak and Okta may put groups only
        there; Entra ID puts them only in the ID token)."""
        claims = dict(payload)
        if access_token and provider.setting("OIDC_OP_USER_ENDPOINT"):
            info = super().get_userinfo(access_token, id_token, payload)
            if not isinstance(info, dict) or info.get("sub") != payload.get("sub"):
                raise _untrusted("its userinfo answer is about someone else than its ID token")
            claims = {**info, **payload}
        return claims

    def get_or_create_user(self, access_token: Any, id_token: Any, payload: Any) -> Any:
        return person_signed_in(self.get_userinfo(access_token, id_token, payload))

    def get_user(self, user_id: Any) -> Any:
        # Django's own lookup: a person deactivated here stays out.
        try:
            user = self.UserModel._default_manager.get(pk=user_id)
        except self.UserModel.DoesNotExist:
            return None
        return user if self.user_can_authenticate(user) else None


def _token_refusal(response: Any) -> str:
    error = ""
    try:
        body = response.json()
        error = str(body.get("error", "")) if isinstance(body, dict) else ""
    except ValueError:
        pass
    status = getattr(response, "status_code", "?")
    detail = f"HTTP {status}" + (f", {error}" if error else "")
    hint = (
        " An admin should check STOPDESK_OIDC_CLIENT_ID and STOPDESK_OIDC_CLIENT_SECRET."
        if error in ("invalid_client", "unauthorized_client") or status == 401
        else ""
    )
    return f"{provider.name()} refused stopdesk's request for the sign-in's tokens ({detail}).{hint}"


def person_signed_in(claims: dict[str, Any]) -> Any:
    """The account for these verified claims, created on first sign-in, with its roles set from
    the group claim (every role the claim no longer gives is taken away)."""
    conf = provider.conf()
    username = str(claim(claims, conf["username_claim"]) or claims.get("email") or "").strip()[:150]
    if not username:
        raise SignInRefused(
            "Single sign-on is not working",
            f"{provider.name()} sent no {conf['username_claim']!r} or 'email' claim to name you by. An admin "
            "should check STOPDESK_OIDC_USERNAME_CLAIM and the scopes the provider releases.",
        )
    roles = roles_from(claims, conf)
    if not roles:
        raise SignInRefused(
            "No role in stopdesk",
            f"{provider.name()} signed you in as {username}, but you are in none of the groups that give a role "
            "in stopdesk. Ask whoever manages those groups to add you.",
        )
    roles_ensure()
    users = get_user_model()
    with transaction.atomic():
        # get_or_create: two first sign-ins of one person at once make one account.
        user, created = users._default_manager.get_or_create(
            username=username, defaults={"password": make_password(None)}
        )
        user = users._default_manager.select_for_update().get(pk=user.pk)
        if not created and user.has_usable_password():
            raise SignInRefused(
                "That name belongs to a local account",
                f"A stopdesk account named {username} signs in with a password here, so single sign-on does not "
                "sign into it. Sign in with that account's password, or ask an admin.",
            )
        if not user.is_active:
            raise SignInRefused("This account is deactivated", f"The stopdesk account {username} is deactivated.")
        user.email = str(claims.get("email") or user.email or "")[:254]
        user.first_name = str(claims.get("given_name") or claims.get("name") or user.first_name or "")[:150]
        user.last_name = str(claims.get("family_name") or "")[:150]
        user.is_staff = user.is_superuser = "admin" in roles
        user.save()
        granted = {ROLES[role] for role in roles if ROLES[role]}
        every = Group.objects.filter(name__in=[g for g in ROLES.values() if g])
        user.groups.remove(*[g for g in every if g.name not in granted])
        user.groups.add(*[g for g in every if g.name in granted])
    return user
