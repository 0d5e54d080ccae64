"""Input PostgreSQL cannot store, refused at the door for every page and endpoint at once.

PostgreSQL text cannot hold NUL (0x00), and a lone surrogate cannot be encoded as UTF-8. A query
parameter or form field carrying one would reach a filter or a write and fail inside the
database as a 500 (`psycopg.DataError`), wherever it is used: a search box, an admin filter, a
form. This middleware refuses such a request before any view runs, naming the parameter: 422 in
the API's JSON error shape under /api/, a 400 page elsewhere (dashboard, admin). JSON bodies are
the API schemas' to check (`stopdesk.agent.schemas`), which name the field by its path.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import render

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def unstorable_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store `value` as text, or None."""
    if "\x00" in value:
        return "contains a NUL byte, which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate), which cannot be stored"
    return None


def _first_unstorable(params: QueryDict) -> tuple[str, str] | None:
    for name, values in params.lists():
        for value in (name, *values):
            if (problem := unstorable_problem(value)) is not None:
                return name, problem
    return None


class UnstorableInputMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        found = _first_unstorable(request.GET)
        where = "query parameter"
        if found is None and request.content_type in FORM_TYPES and request.method not in ("GET", "HEAD"):
            found, where = _first_unstorable(request.POST), "form field"
        if found is None:
            return self.get_response(request)
        name, problem = found
        shown = name.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")[:80]
        detail = f"The {where} {shown!r} {problem}."
        if request.path.startswith("/api/"):
            return JsonResponse({"error": "invalid_field", "detail": detail, "field": shown}, status=422)
        return render(request, "400.html", {"detail": detail, "field": shown}, status=400)
