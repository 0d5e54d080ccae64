"""Request bodies sent with `Transfer-Encoding: chunked`.

Django sizes a request body by Content-Length, which a chunked request does not have, so without
this it reads such a body as empty and a request's detail and evidence are silently dropped.
A server that decodes chunked framing (gunicorn does, and says so with `wsgi.input_terminated`)
hands us a stream that ends where the body ends: we read it, within Django's upload limit. A
server that does not (Django's development and test server) would hand us the raw framing, so
the request is refused with 411: send a Content-Length.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


def _refusal(request: HttpRequest, status: int, code: str, detail: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"error": code, "detail": detail}, status=status)
    else:
        response = HttpResponse(detail, status=status, content_type="text/plain; charset=utf-8")
    # No `Connection: close` of our own: WSGI forbids hop-by-hop headers from the application.
    return response


class ChunkedBodyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        encoding = request.META.get("HTTP_TRANSFER_ENCODING", "")
        if "chunked" not in encoding.lower():
            return self.get_response(request)
        if not request.META.get("wsgi.input_terminated"):
            return _refusal(
                request, 411, "length_required", "This server cannot read a chunked body; send a Content-Length."
            )
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440
        body = request.META["wsgi.input"].read(limit + 1)
        if len(body) > limit:
            return _refusal(request, 413, "payload_too_large", f"The body is larger than {limit} bytes.")
        # From here on the request is an ordinary one with a known length.
        request.META["CONTENT_LENGTH"] = str(len(body))
        request._stream = io.BytesIO(body)  # type: ignore[attr-defined]
        request._read_started = False  # type: ignore[attr-defined]
        return self.get_response(request)
