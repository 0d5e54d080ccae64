"""The ASGI application. Production serves the stop watch endpoint with it (uvicorn, `python -m
stopdesk watch`). That path (and the watch of many tasks) goes to a plain ASGI handler (`stopdesk.push.watch.asgi_watch`), outside
Django's request cycle, which keeps a thread for every request in flight: a waiting watcher is then
only a future on the event loop. So do the registration on an agent's path before each tool call
and the results of its calls (`stopdesk.api.agent_door`), which hands Django what is not plain.
Every other path is Django's."""

import os
import re
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

WATCH = re.compile(r"^/api/v1/tasks/([^/]+)/stop/watch/?$")
WATCH_MANY = re.compile(r"^/api/v1/watch/?$")
STARTED = re.compile(r"^/api/v1/tasks/([^/]+)/items/started/?$")
RESULTS = re.compile(r"^/api/v1/results/?$")
RESULT = re.compile(r"^/api/v1/items/([^/]+)/result/?$")


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] == "http" and (match := WATCH.match(scope["path"])):
        await asgi_watch(scope, receive, send, match.group(1))
        return
    if scope["type"] == "http" and WATCH_MANY.match(scope["path"]):
        await asgi_watch_many(scope, receive, send)
        return
    if scope["type"] == "http" and (match := STARTED.match(scope["path"])):
        await asgi_register_started(scope, receive, send, match.group(1))
        return
    if scope["type"] == "http" and RESULTS.match(scope["path"]):
        await asgi_write_results(scope, receive, send)
        return
    if scope["type"] == "http" and (match := RESULT.match(scope["path"])):
        await asgi_finish_fast(scope, receive, send, match.group(1))
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
