"""Per-runtime bearer tokens. Only a token's SHA-256 is stored, so a lookup by hash is the check."""

from __future__ import annotations

from django.http import HttpRequest

from stopdesk.models import Runtime
from stopdesk.protocol.errors import Unauthorized


def authenticate(request: HttpRequest) -> Runtime:
    return runtime_for(request.headers.get("Authorization", ""))


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` header, "" if it is not one. The scheme is
    case-insensitive (RFC 9110, section 11.1): the runtime API and /metrics read it here alike."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def runtime_for(authorization: str) -> Runtime:
    """The runtime an Authorization header's bearer token belongs to."""
    token = bearer_token(authorization)
    if not token:
        raise Unauthorized("Send the runtime's token as 'Authorization: Bearer <token>'.")
    runtime = Runtime.objects.filter(token_hash=Runtime.hash_token(token), revoked_at__isnull=True).first()
    if runtime is None:
        raise Unauthorized("Unknown or revoked token.")
    return runtime
