"""The OpenAPI 3.1 document, built from the same operation table and models the views use."""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from pydantic import TypeAdapter

from stopdesk.api.views import OPERATIONS
from stopdesk.protocol import types
from stopdesk.push import watch

REF = "#/components/schemas/{model}"
ANSWERS = (
    "TaskInfo",
    "TaskDetail",
    "ItemInfo",
    "RecordInfo",
    "StopInfo",
    "HeartbeatInfo",
    "StopWatchInfo",
    "StartedInfo",
    "ResultInfo",
    "ResultsInfo",
    "LaunchedInfo",
)
ERROR_TEXT = {
    400: "Malformed JSON, or a body that is not an object (error malformed_json).",
    401: "Missing, unknown or revoked token.",
    404: "Unknown id, or one that belongs to another runtime.",
    409: "task_stopped (Stop was requested; the item is cancelled) or illegal_transition (naming `state`).",
    413: "The body is larger than 64 KiB.",
    422: "A missing, unknown or invalid field, named in `field`.",
}
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string"},
        "detail": {"type": "string"},
        "field": {"type": ["string", "null"]},
        "state": {"type": ["string", "null"], "description": "The item's current state (409)."},
    },
}


def _schema(adapter: TypeAdapter[Any], components: dict[str, Any], mode: str) -> dict[str, Any]:
    schema = adapter.json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
    components.update(schema.pop("$defs", {}))
    return schema


@functools.cache
def document() -> dict[str, Any]:
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    for name in ANSWERS:
        components[name] = _schema(TypeAdapter(getattr(types, name)), components, "serialization")
    paths: dict[str, Any] = {}
    for op in OPERATIONS:
        parameters: list[dict[str, Any]] = [
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
            }
            for name in ("task_id", "item_id")
            if "{" + name + "}" in op.path
        ]
        if op.replayable:
            parameters.append(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "description": "Repeating the request with the same key returns the first answer.",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                }
            )
        operation: dict[str, Any] = {
            "operationId": op.name,
            "summary": op.summary.split("\n")[0],
            "description": op.summary,
            "parameters": parameters,
            "responses": {
                str(op.status): {
                    "description": "OK",
                    "content": {"application/json": {"schema": {"$ref": REF.format(model=op.returns)}}},
                },
                **{
                    str(code): {
                        "description": ERROR_TEXT[code],
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
                    }
                    for code in op.errors
                },
            },
        }
        if op.body is not None:
            body = _schema(TypeAdapter(op.body), components, "validation")
            components[op.body.__name__] = body
            required = bool(body.get("required"))
            operation["requestBody"] = {
                "required": required,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=op.body.__name__)}}},
            }
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    paths[watch.PATH] = {"get": _watch_operation(), **_watch_servers()}
    paths[watch.MANY_PATH] = {"post": _watch_many_operation(), **_watch_servers()}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "stopdesk runtime API",
            "version": "1",
            "description": "Agents report their work and pass the cancellation boundary. Every error has the shape "
            '{"error": code, "detail": text, "field": name?}.',
        },
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A runtime token from `manage.py create_runtime_token`.",
                }
            },
        },
    }


def _watch_servers() -> dict[str, Any]:
    """Where the watch is served, when a watch server is configured (the web door answers 307)."""
    if not settings.STOPDESK_WATCH_URL:
        return {}
    return {"servers": [{"url": f"{settings.STOPDESK_WATCH_URL}/api/v1", "description": "The watch server."}]}


def _watch_operation() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}
    return {
        "operationId": "watch_stop",
        "summary": "Wait for the task's Stop: answers the moment it commits.",
        "description": (
            "A long poll. It answers `stopped: true` as soon as the task's stop request commits (at once if it "
            "already has), or `stopped: false` after `timeout` seconds; then watch again. Pushed by PostgreSQL "
            "LISTEN/NOTIFY, so a waiting watcher costs the server no query while it waits; each request costs "
            "three (the token, the task, a connection check), so a longer timeout costs fewer. Serve it under "
            "ASGI (uvicorn) so it costs no thread either."
        ),
        "parameters": [
            {
                "name": "task_id",
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
            },
            {
                "name": "timeout",
                "in": "query",
                "required": False,
                "description": f"Seconds to wait before answering `stopped: false` (default {watch.DEFAULT_TIMEOUT_S:g}).",
                "schema": {"type": "number", "minimum": 0, "maximum": watch.MAX_TIMEOUT_S},
            },
        ],
        "responses": {
            "200": {
                "description": "Stopped, or the timeout passed first.",
                "content": {"application/json": {"schema": {"$ref": REF.format(model="StopWatchInfo")}}},
            },
            "401": {"description": ERROR_TEXT[401], **error},
            "307": {
                "description": "Served by the watch server, not here (`STOPDESK_WATCH_URL` is set): repeat the "
                "request at `Location`; the body's `watch_url` names the server, for every later watch. "
                "A look with no wait (`timeout=0`) is answered here all the same.",
                **error,
            },
            "404": {"description": ERROR_TEXT[404], **error},
            "422": {"description": "`timeout` is not a number of seconds in range (field `timeout`).", **error},
        },
    }


def _watch_many_operation() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}
    info = {"$ref": REF.format(model="StopWatchInfo")}
    stopped = {"type": "object", "required": ["stopped"], "properties": {"stopped": {"type": "array", "items": info}}}
    return {
        "operationId": "watch_stop_many",
        "summary": "Wait for the Stop of any of many tasks: one long poll for all of them.",
        "description": (
            "The stop watch for many tasks at once: answers `stopped` (every task of the list stopped by then) as "
            "soon as any of them is stopped, or `stopped: []` after `timeout` seconds; then watch again with the "
            "tasks still waited on. A client watching many runs holds one request instead of one per run. With "
            "`stream: true` the watch server keeps the request open instead: a line once the tasks are watched "
            "(those already stopped, or none), then a line as each Stop commits, each line this answer's object, "
            "newline-delimited (`application/x-ndjson`), until every task is stopped or `timeout` passes; the "
            "web door serving watches itself answers such a request with one answer, as above."
        ),
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["tasks"],
                        "properties": {
                            "tasks": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": watch.MAX_TASKS,
                                "items": {"type": "integer", "minimum": 1},
                            },
                            "timeout": {"type": "number", "minimum": 0, "maximum": watch.MAX_TIMEOUT_S},
                            "stream": {"type": "boolean", "default": False},
                        },
                    }
                }
            },
        },
        "responses": {
            "200": {
                "description": (
                    "Some stopped, or the timeout passed first (`stopped: []`); streamed, one such object a line."
                ),
                "content": {
                    "application/json": {"schema": stopped},
                    "application/x-ndjson": {"schema": stopped},
                },
            },
            "307": {"description": "Served by the watch server, not here: repeat the request at `Location`.", **error},
            "400": {"description": "The body is not a JSON object.", **error},
            "401": {"description": ERROR_TEXT[401], **error},
            "404": {
                "description": "Tasks unknown or of another runtime: the body's `tasks` lists them; nothing is watched.",
                **error,
            },
            "422": {"description": "`tasks`, `timeout` or `stream` is not valid (`field` names it).", **error},
        },
    }


def openapi_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document(), json_dumps_params={"indent": 1})
