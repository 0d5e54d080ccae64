"""What the runtime API reads of a request before its endpoint runs, the same at both doors that
serve it (Django's views, `stopdesk.api.views`, and the agent door, `stopdesk.api.agent_door`): the
Idempotency-Key and the JSON body, each refused with the same error naming what is wrong."""

from __future__ import annotations

import json
from typing import Any

from stopdesk.protocol.errors import InvalidRequest, MalformedRequest, PayloadTooLarge

MAX_BODY_BYTES = 64 * 1024


def request_key(header: str | None) -> str | None:
    """The request's Idempotency-Key header, checked; None without one."""
    if header is None:
        return None
    if not 1 <= len(header) <= 200 or "\x00" in header:
        raise InvalidRequest("Idempotency-Key must be 1 to 200 characters.", field="Idempotency-Key")
    return header


def too_large(declared: str | None) -> bool:
    """Whether a request's Content-Length already says its body is over the limit."""
    try:
        return int(declared or 0) > MAX_BODY_BYTES
    except ValueError:
        return False


def json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object ({} for none)."""
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"The body is larger than {MAX_BODY_BYTES} bytes.")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise MalformedRequest(f"The body is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise MalformedRequest("The body must be a JSON object.")
    return data


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
