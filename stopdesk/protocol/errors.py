"""The errors both doors raise: the HTTP client maps the JSON error shape onto them, and the
in-process LocalRuntime raises them directly, so agent code catches the same classes either way."""

from __future__ import annotations

from typing import Any


class StopdeskError(Exception):
    """A refusal with the API's error shape: {"error": code, "detail": text, "field": name?}."""

    status = 400
    code = "error"

    def __init__(self, detail: str, *, code: str | None = None, field: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.field = field
        self.extra = extra

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return body

    def headers(self) -> list[tuple[str, str]]:
        """The HTTP headers this refusal is answered with, beside its JSON body."""
        return []


class StopRequested(StopdeskError):
    """Stop was requested for the task. Raised by start() and submit() (the item did not start
    and is now cancelled) and by heartbeat() (stop between steps and report with cancel())."""

    status = 409
    code = "task_stopped"

    def __init__(
        self,
        detail: str = "Stop was requested for this task.",
        *,
        task: int | None = None,
        item: int | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail, task=task, item=item, **extra)
        self.task_id = task
        self.item_id = item


class InvalidRequest(StopdeskError):
    """Malformed JSON (400) or a missing or invalid field (422); `field` names it."""

    status = 422
    code = "invalid_field"


class IdempotencyKeyReused(InvalidRequest):
    """The Idempotency-Key was already used with a different body: nothing was done."""

    code = "idempotency_key_reused"


class MalformedRequest(InvalidRequest):
    """The body is not a JSON object."""

    status = 400
    code = "malformed_json"


class MethodNotAllowed(StopdeskError):
    status = 405
    code = "method_not_allowed"

    def headers(self) -> list[tuple[str, str]]:
        return [("Allow", ", ".join(self.extra.get("allow", [])))]


class Unauthorized(StopdeskError):
    status = 401
    code = "unauthorized"

    def headers(self) -> list[tuple[str, str]]:
        return [("WWW-Authenticate", 'Bearer realm="stopdesk"')]


class NotFound(StopdeskError):
    """Unknown id, or one that belongs to another runtime (ids do not leak)."""

    status = 404
    code = "not_found"


class TaskClosed(StopRequested):
    """The task was closed (its runtime said it is over, or it stayed idle past the timeout): it
    takes no new work. A StopRequested, so an agent loop that ends on Stop ends here too."""

    code = "task_closed"


class Conflict(StopdeskError):
    """The item's state does not allow the move; `state` names the current one."""

    status = 409
    code = "illegal_transition"

    @property
    def state(self) -> str | None:
        return self.extra.get("state")


class PayloadTooLarge(StopdeskError):
    status = 413
    code = "body_too_large"


class ServerError(StopdeskError):
    """A 5xx, or a response that is not the API's JSON."""

    status = 500
    code = "server_error"


_BY_STATUS: dict[int, type[StopdeskError]] = {
    400: MalformedRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    422: InvalidRequest,
}


def error_from_response(status: int, body: Any) -> StopdeskError:
    """The exception for an error response (the client side of the mapping)."""
    if not isinstance(body, dict) or "error" not in body:
        bad = ServerError(f"HTTP {status} without the API's error body.", code="bad_response")
        bad.status = status
        return bad
    code = str(body.get("error"))
    detail = str(body.get("detail", ""))
    extra = {k: v for k, v in body.items() if k not in ("error", "detail", "field")}
    if code == StopRequested.code:
        return StopRequested(detail, **extra)
    if code == TaskClosed.code:
        return TaskClosed(detail, **extra)
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else StopdeskError)
    if status == 422 and code == IdempotencyKeyReused.code:
        cls = IdempotencyKeyReused
    err = cls(detail, code=code, field=body.get("field"), **extra)
    err.status = status
    return err
