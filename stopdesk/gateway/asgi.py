"""The gateway's ASGI application, for `python -m stopdesk mcp-gateway` (uvicorn --factory)."""

from __future__ import annotations

import os

from starlette.applications import Starlette


def application() -> Starlette:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")
    import django

    django.setup()
    from stopdesk import config
    from stopdesk.gateway.app import gateway_app  # after django.setup(): it reads the models

    return gateway_app(host=config.bind_host())
