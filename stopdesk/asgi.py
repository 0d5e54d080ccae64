"""The ASGI application. Production serves the stop watch endpoint with it (uvicorn, `python -m
stopdesk watch`). That path (and the watch of many tasks) goes to a plain ASGI handler (`stopdesk.push.watch.asgi_watch`), outside
Django's request cycle, which keeps a thread for every request in flight: a waiting watcher is then
only a future on the event loop. So do the registration on an agent's path before each tool call
and the results of its calls (`stopdesk.api.agent_door`), which hands Django what is not plain.
Every other path is Django's."""

import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")

django_application = get_asgi_application()

from stopdesk.api.agent_door import (  # noqa: E402 - needs the apps loaded above
    asgi_finish_fast,
    asgi_register_started,
    asgi_write_results,
    close_pools,
)
from stopdesk.push.watch import asgi_watch, asgi_watch_many  # noqa: E402
from stopdesk.warm import load_views  # noqa: E402

load_views()  # the requests the agent door hands to Django do not load them on its threads

# The paths served outside Django's request cycle, each by its handler, given the path's ids.
ROUTES: list[tuple[re.Pattern[str], Callable[..., Awaitable[None]]]] = [
    (re.compile(r"^/api/v1/tasks/([^/]+)/stop/watch/?$"), asgi_watch),
    (re.compile(r"^/api/v1/watch/?$"), asgi_watch_many),
    (re.compile(r"^/api/v1/tasks/([^/]+)/items/started/?$"), asgi_register_started),
    (re.compile(r"^/api/v1/results/?$"), asgi_write_results),
    (re.compile(r"^/api/v1/items/([^/]+)/result/?$"), asgi_finish_fast),
]


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] == "http":
        for pattern, handler in ROUTES:
            if match := pattern.match(scope["path"]):
                await handler(scope, receive, send, *match.groups())
                return
    await django_application(scope, receive, send)


async def _lifespan(receive: Any, send: Any) -> None:
    """The server's start and end: at the end, the agent door's connections are closed."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await close_pools()
            await send({"type": "lifespan.shutdown.complete"})
            return
