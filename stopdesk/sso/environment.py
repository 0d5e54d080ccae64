"""STOPDESK_OIDC_* from the environment, checked: a mistake is one readable line at start-up
(config.ConfigError), not a sign-in page that fails later."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from stopdesk.config import ConfigError

ROLES = {"operator": "operators", "reviewer": "reviewers", "approver": "approvers", "admin": ""}
EXAMPLE = "operator=sd-operators;reviewer=sd-reviewers;approver=sd-approvers;admin=sd-admins"


def _roles(raw: str) -> dict[str, list[str]]:
    """'approver=finance-leads,cfo-office;operator=ops' -> {role: [provider group, ...]}."""
    mapping: dict[str, list[str]] = {}
    for part in (p.strip() for p in raw.split(";")):
        if not part:
            continue
        role, sep, groups = part.partition("=")
        role = role.strip().lower()
        if not sep or role not in ROLES:
            raise ConfigError(
                f"STOPDESK_OIDC_ROLES: {part!r} is not ROLE=GROUP[,GROUP]; roles are "
                f"{', '.join(ROLES)} (e.g. {EXAMPLE})."
            )
        names = [g.strip() for g in groups.split(",") if g.strip()]
        if not names:
            raise ConfigError(f"STOPDESK_OIDC_ROLES: the role {role!r} names no group.")
        mapping.setdefault(role, []).extend(names)
    return mapping


def from_environment(environ: Any = os.environ) -> dict[str, Any]:
    """The provider's settings, or {} when STOPDESK_OIDC_ISSUER is not set (single sign-on off)."""
    issuer = environ.get("STOPDESK_OIDC_ISSUER", "").strip()
    if not issuer:
        return {}
    parts = urlsplit(issuer)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"STOPDESK_OIDC_ISSUER={issuer!r} is not a URL (e.g. https://login.example.com/realms/acme).")
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme == "http" and not loopback:
        raise ConfigError(f"STOPDESK_OIDC_ISSUER={issuer!r}: a provider is reached over https (http only on loopback).")
    client_id = environ.get("STOPDESK_OIDC_CLIENT_ID", "").strip()
    secret = environ.get("STOPDESK_OIDC_CLIENT_SECRET", "").strip()
    if not client_id or not secret:
        raise ConfigError(
            "STOPDESK_OIDC_ISSUER is set, so single sign-on needs STOPDESK_OIDC_CLIENT_ID and "
            "STOPDESK_OIDC_CLIENT_SECRET too (the client registered for stopdesk at the provider)."
        )
    roles = _roles(environ.get("STOPDESK_OIDC_ROLES", ""))
    if not roles:
        raise ConfigError(
            "STOPDESK_OIDC_ROLES is empty: name the provider's groups that give each role, "
            f"e.g. STOPDESK_OIDC_ROLES='{EXAMPLE}'."
        )
    try:
        session_seconds = int(environ.get("STOPDESK_OIDC_SESSION_SECONDS", "300"))
    except ValueError:
        session_seconds = 0
    if session_seconds < 1:
        raise ConfigError("STOPDESK_OIDC_SESSION_SECONDS must be a whole number of seconds, 1 or more.")
    return {
        "issuer": issuer.rstrip("/"),
        "client_id": client_id,
        "client_secret": secret,
        "name": environ.get("STOPDESK_OIDC_NAME", "").strip() or "single sign-on",
        "scopes": environ.get("STOPDESK_OIDC_SCOPES", "openid email profile").strip(),
        "groups_claim": environ.get("STOPDESK_OIDC_GROUPS_CLAIM", "groups").strip(),
        "username_claim": environ.get("STOPDESK_OIDC_USERNAME_CLAIM", "preferred_username").strip(),
        "roles": roles,
        "session_seconds": session_seconds,
        "sign_algo": environ.get("STOPDESK_OIDC_SIGN_ALGO", "RS256").strip(),
    }


def form_origins(conf: dict[str, Any]) -> list[str]:
    """Where a form of ours may end up: the sign-out form is redirected to the provider's
    end-session endpoint, and a form sent after the session's lifetime to its authorization
    endpoint first (the re-check). CSP's form-action covers those redirects too."""
    if not conf:
        return []
    parts = urlsplit(conf["issuer"])
    return [f"{parts.scheme}://{parts.netloc}"]
