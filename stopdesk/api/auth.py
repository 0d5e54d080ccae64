"""Per-runtime bearer tokens. Only a token's SHA-256 is stored, so a lookup by hash is the check."""

from __future__ import annotations

from django.http import HttpRequest

from stopdesk.client.errors import Unauthorized
from stopdesk.models import Runtime


def authenticate(request: HttpRequest) -> Runtime:
    return runtime_for(request.headers.get("Authorization", ""))


def runtime_for(authorization: str) -> Runtime:
    """The runtime an Authorization header's bearer token belongs to."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Send the runtime's token as 'Authorization: Bearer <token>'.")
    runtime = Runtime.objects.filter(token_hash=Runtime.hash_token(token), revoked_at__isnull=True).first()
    if runtime is None:
        raise Unauthorized("Unknown or revoked token.")
    return runtime
