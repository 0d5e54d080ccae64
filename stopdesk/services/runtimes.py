"""Runtime tokens: issuing and revoking them (the management commands and the admin; each act is an
audit event), and checking one (the API's doors). A token is shown once: only its SHA-256 is
stored, so a lookup by hash is the check."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from stopdesk.models import Runtime
from stopdesk.protocol.errors import Unauthorized
from stopdesk.services.events import event_record
from stopdesk.services.sql import fetchone_async

if TYPE_CHECKING:
    import psycopg


def runtime_create(*, name: str, actor: str) -> tuple[Runtime, str]:
    """A new runtime and its token (the only time the token is seen)."""
    if Runtime.objects.filter(name=name).exists():
        raise ValueError(f"Runtime {name!r} exists; rotate its token to get a new one.")
    runtime = Runtime(name=name)
    return runtime, runtime_rotate(runtime=runtime, actor=actor)


def runtime_rotate(*, runtime: Runtime, actor: str) -> str:
    """Give the runtime (saved or not) a new token; the old one stops working at once. A rotated
    token is active even if the old one had been revoked."""
    with transaction.atomic():
        token = runtime.issue_token()
        runtime.revoked_at = None
        runtime.save()
        event_record(
            kind="runtime_token_issued",
            actor=actor,
            message=f"Token {runtime.token_prefix}... for {runtime.name}",
            data={"runtime": runtime.pk, "prefix": runtime.token_prefix},
        )
    return token


def runtime_revoke(*, runtime: Runtime, actor: str) -> bool:
    """Revoke the runtime's token at once. False if it was already revoked."""
    with transaction.atomic():
        revoked = Runtime.objects.filter(pk=runtime.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if revoked:
            event_record(
                kind="runtime_token_revoked",
                actor=actor,
                message=f"Token of {runtime.name} revoked",
                data={"runtime": runtime.pk, "prefix": runtime.token_prefix},
            )
    runtime.refresh_from_db()
    return bool(revoked)


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
    with connection.cursor() as cursor:
        cursor.execute(_runtime_by_token_sql(), [Runtime.hash_token(token)])
        row = cursor.fetchone()
    return _runtime_of(row)


async def runtime_for_async(conn: psycopg.AsyncConnection[Any], authorization: str) -> Runtime:
    """`runtime_for` on an asyncio caller's own connection (the agent door's): the same read and
    the same answers."""
    token = bearer_token(authorization)
    if not token:
        raise Unauthorized("Send the runtime's token as 'Authorization: Bearer <token>'.")
    return _runtime_of(await fetchone_async(conn, _runtime_by_token_sql(), [Runtime.hash_token(token)]))


def _runtime_of(row: Any) -> Runtime:
    if row is None:
        raise Unauthorized("Unknown or revoked token.")
    return Runtime.from_db(connection.alias, _runtime_fields(), row)


# Every runtime API request (and every watch) asks this first, most often on an agent's path before a
# tool call: one read by the unique hash, its SQL written once rather than compiled by the ORM on each
# request (which cost several times the read itself).
@functools.cache
def _runtime_fields() -> list[str]:
    return [field.attname for field in Runtime._meta.concrete_fields]


@functools.cache
def _runtime_by_token_sql() -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in Runtime._meta.concrete_fields)
    table = quote(Runtime._meta.db_table)
    return f"SELECT {columns} FROM {table} WHERE {quote('token_hash')} = %s AND {quote('revoked_at')} IS NULL"
