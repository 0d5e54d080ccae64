"""What a server process loads before it serves its first request."""

import contextlib

from django.urls import Resolver404, get_resolver


def load_views() -> None:
    """Import the URLconf, and through it every view and what the views import (the OpenAI SDK
    among them: about a second of one CPU). Django does it on the first request otherwise, so
    every new web process answered its first request, which may be a Stop, a second late."""
    resolver = get_resolver()
    resolver.url_patterns  # noqa: B018 - the import is the point
    with contextlib.suppress(Resolver404):
        resolver.resolve("/")  # and the resolver's own tables
