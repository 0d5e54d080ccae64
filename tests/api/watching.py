"""What the watch tests share: a Stop pressed from another thread a moment later, as a person
would while an agent waits."""

from __future__ import annotations

import threading
import time

from django.db import connection

from stopdesk.services.stop import task_request_stop

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
