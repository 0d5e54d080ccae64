"""Request bodies: one strict model per endpoint. The same models validate the in-process
LocalRuntime's arguments and give the OpenAPI document its request schemas."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic import ValidationError as PydanticValidationError

from stopdesk.protocol.errors import InvalidRequest
from stopdesk.protocol.ids import MAX_ID
from stopdesk.protocol.spec import ITEM_FIELDS, ItemSpec
from stopdesk.protocol.types import MAX_RESULTS
from stopdesk.record_ids import record_id_problem
from stopdesk.states import Effect, Kind

MAX_JSON_DEPTH = 16
MAX_LAUNCHED_CALLS = 200


def _storable(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and a lone surrogate cannot be encoded as UTF-8: both would
    # otherwise fail inside the database as a 500 instead of a 422 naming the field.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    def walk(node: Any, depth: int) -> None:
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, str):
            _storable(node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError("must not contain NaN or Infinity")
        elif isinstance(node, dict):
            for key, child in node.items():
                _storable(str(key))
                walk(child, depth + 1)
        elif isinstance(node, list):
            for child in node:
                walk(child, depth + 1)

    walk(value, 0)
    return value


def _record_id(value: str) -> str:
    if (problem := record_id_problem(value)) is not None:
        raise ValueError(problem)
    return value


def _url(value: str) -> str:
    if value:
        try:
            URLValidator(schemes=["http", "https"])(value)
        except DjangoValidationError:
            raise ValueError("must be an http(s) URL") from None
    return value


def Text(max_length: int, min_length: int = 0) -> Any:
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length), AfterValidator(_storable)]


JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
Lease = Annotated[int, Field(ge=1, le=86_400, description="Seconds before a silent worker is presumed lost.")]
KindName = Literal["model_request", "local_worker", "remote_tool", "external_operation"]
EffectName = Literal["created", "updated", "sent", "deleted", "archived"]
assert set(KindName.__args__) == set(Kind.values) and set(EffectName.__args__) == set(Effect.values)  # type: ignore[attr-defined]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def parse(cls, data: Any) -> Any:
        """Validate, or raise InvalidRequest naming the first bad field."""
        try:
            return cls.model_validate(data)
        except PydanticValidationError as exc:
            raise invalid_request(exc) from None


def invalid_request(exc: PydanticValidationError) -> InvalidRequest:
    error = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"]) or None
    kind = error["type"]
    if kind == "missing":
        return InvalidRequest(f"{field} is required.", code="missing_field", field=field)
    if kind == "extra_forbidden":
        return InvalidRequest(f"{field} is not a field of this request.", code="unknown_field", field=field)
    message = str(error["msg"]).removeprefix("Value error, ")
    return InvalidRequest(f"{field}: {message}" if field else message, code="invalid_field", field=field)


class CreateTask(Body):
    title: Text(200, 1)  # type: ignore[valid-type]


class RegisterItem(Body):
    kind: KindName
    noun: Text(40, 1)  # type: ignore[valid-type]
    noun_plural: Text(40) = ""  # type: ignore[valid-type]
    mechanism: Text(32, 1) = "manual"  # type: ignore[valid-type]
    handle: Text(200) = ""  # type: ignore[valid-type]
    label: Text(200) = ""  # type: ignore[valid-type]
    parent: Id | None = Field(None, description="Another item of the same task.")
    idempotency_key: Text(200) = ""  # type: ignore[valid-type]
    detail: JsonObject | None = None

    def spec(self) -> ItemSpec:
        """The validated registration, as it travels on (`stopdesk.protocol.spec`)."""
        return ItemSpec(**self.model_dump(include=set(ITEM_FIELDS)))


class Start(Body):
    worker: Text(200) = ""  # type: ignore[valid-type]
    lease_seconds: Lease | None = None


class Heartbeat(Body):
    lease_seconds: Lease | None = None


class Submit(Body):
    idempotency_key: Text(200, 1) = Field(  # type: ignore[valid-type]
        description="The key the external call carries, recorded before it goes out."
    )
    worker: Text(200) = ""  # type: ignore[valid-type]
    lease_seconds: Lease | None = None


class AttachRecord(Body):
    system: Text(64, 1)  # type: ignore[valid-type]
    record_id: Annotated[Text(200, 1), AfterValidator(_record_id)]  # type: ignore[valid-type]
    effect: EffectName
    version: Text(200) = ""  # type: ignore[valid-type]
    reversible: bool = False
    reversal: Text(64) = ""  # type: ignore[valid-type]
    link: Annotated[str, StringConstraints(max_length=500), AfterValidator(_storable), AfterValidator(_url)] = ""


class RecordHandle(Body):
    handle: Text(200, 1) = Field(  # type: ignore[valid-type]
        description="The remote id of the dispatched work: a response id, an MCP task id, an operation URL."
    )
    detail: JsonObject | None = Field(None, description="Mechanism facts merged into the item's detail.")


class Finish(Body):
    status: Literal["completed", "failed"]
    detail: Text(200) = ""  # type: ignore[valid-type]
    evidence: JsonObject | None = None


class MarkUncertain(Body):
    detail: Text(200) = ""  # type: ignore[valid-type]
    evidence: JsonObject | None = None


class Cancel(Body):
    detail: Text(200) = ""  # type: ignore[valid-type]


class NoteEvidence(Body):
    message: Text(200, 1) = Field(description="What was seen, as a person reads it.")  # type: ignore[valid-type]
    evidence: JsonObject = Field(description="Facts merged into the item's evidence; its state is unchanged.")


class RequestStop(Body):
    reason: Text(2000) = ""  # type: ignore[valid-type]


class CloseTask(Body):
    reason: Text(2000) = ""  # type: ignore[valid-type]


# The calls a framework run makes most (stopdesk.agent.runtime.LocalRuntime), over HTTP.


class RegisterStarted(RegisterItem):
    submit_key: Text(200) = Field(  # type: ignore[valid-type]
        "", description="Pass the boundary by submitting with this idempotency key (an external action); else start."
    )
    worker: Text(200) = ""  # type: ignore[valid-type]
    lease_seconds: Lease | None = None


class FinishFast(Body):
    status: Literal["completed", "failed"]
    detail: Text(200) = ""  # type: ignore[valid-type]
    open_item: Id | None = Field(
        None, description="An item of the same task the caller holds open (its run), so the task cannot settle now."
    )


class ItemResult(FinishFast):
    """One item's result in `WriteResults`: what `POST /items/{item_id}/result` takes, and the item;
    or, with status "stopped", what `POST /items/{item_id}/stopped` takes."""

    status: Literal["completed", "failed", "stopped"] = Field(  # type: ignore[assignment]
        description='"completed" or "failed" as `POST /items/{item_id}/result` writes it; "stopped" as '
        "`POST /items/{item_id}/stopped` does (the work stopped because of Stop)."
    )
    item: Id


class WriteResults(Body):
    results: list[ItemResult] = Field(min_length=1, max_length=MAX_RESULTS)


class ReportStopped(Body):
    detail: Text(200) = ""  # type: ignore[valid-type]


class LaunchedRecord(Body):
    """The record a launched call's output named (a create's or an update's answer)."""

    id: Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_record_id)]
    version: Text(200) = ""  # type: ignore[valid-type]


class LaunchedCall(Body):
    """One tool call a model response ran itself, as read from its output items."""

    type: Text(64, 1)  # type: ignore[valid-type]
    call_id: Text(200, 1)  # type: ignore[valid-type]
    server_label: Text(200) = ""  # type: ignore[valid-type]
    tool: Text(200) = ""  # type: ignore[valid-type]
    status: Text(64) = ""  # type: ignore[valid-type]
    error: Text(2000) | None = None  # type: ignore[valid-type]
    read_only: bool = False
    # What it was asked to do (who a mail went to).
    arguments: JsonObject | None = None
    record: LaunchedRecord | None = None


class RecordLaunched(Body):
    calls: list[LaunchedCall] = Field(min_length=1, max_length=MAX_LAUNCHED_CALLS)


class SettleCheck(Body):
    """No fields: the task is in the path."""
