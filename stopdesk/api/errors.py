"""One JSON error shape everywhere: {"error": code, "detail": text, "field": name?}."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from stopdesk.protocol.errors import NotFound, StopdeskError


def error_response(exc: StopdeskError) -> JsonResponse:
    response = JsonResponse(exc.to_json(), status=exc.status)
    for name, value in exc.headers():
        response[name] = value
    return response


def server_error() -> JsonResponse:
    return JsonResponse(
        {"error": "server_error", "detail": "Internal error; the request was rolled back and wrote nothing."},
        status=500,
    )


def unknown_path(request: HttpRequest, path: str = "") -> JsonResponse:
    return error_response(NotFound(f"No API endpoint at {request.path}."))
