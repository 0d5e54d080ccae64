"""What the watch tests share: a Stop pressed from another thread a moment later, as a person
would while an agent waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from stopdesk.services.stop import task_request_stop
from stopdrill.sandbox.server import BackgroundServer

NO_DISPATCH = {"dispatch": lambda ids: None}


def stop_later(task_id: int, delay: float) -> threading.Thread:
    def stop() -> None:
        time.sleep(delay)
        try:
            task_request_stop(task_id=task_id, actor="user:operator", **NO_DISPATCH)
        finally:
            connection.close()

    thread = threading.Thread(target=stop)
    thread.start()
    return thread


@contextmanager
def watch_server_running() -> Iterator[str]:
    """The watch server for real: uvicorn on loopback serving `stopdesk.asgi`, in this process (so
    it listens on the test database); its API's base URL."""

    def app():  # type: ignore[no-untyped-def]
        from stopdesk.asgi import application

        return application

    with BackgroundServer(app, name="watch") as server:
        yield server.url + "/api/v1"
