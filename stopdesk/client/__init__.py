"""stopdesk's runtime client: report an agent's work and obey its Stop from any process.

    from stopdesk.client import Client, StopRequested

    with Client("http://127.0.0.1:8000", token) as sd:
        task = sd.create_task("Analyse invoices")
        item = sd.register(task.id, kind="local_worker", noun="draft")
        try:
            sd.start(item.id)          # the boundary: raises StopRequested after a stop
        except StopRequested:
            return
        ...
        sd.finish(item.id, status="completed")

`AsyncClient` has the same methods, awaited; `stopdesk.agent.runtime.LocalRuntime` has the same methods
in-process. This package imports nothing from Django: it needs only httpx and aiohttp.
"""

from stopdesk.client.aio import AsyncClient
from stopdesk.client.sync import Client
from stopdesk.client.watch import StopWatch
from stopdesk.protocol.action import AsyncExternalAction, ExternalAction
from stopdesk.protocol.errors import (
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServerError,
    StopdeskError,
    StopRequested,
    TaskClosed,
    Unauthorized,
)
from stopdesk.protocol.spec import ItemSpec
from stopdesk.protocol.types import HeartbeatInfo, ItemInfo, RecordInfo, StopInfo, StopWatchInfo, TaskDetail, TaskInfo

__all__ = [
    "AsyncClient",
    "AsyncExternalAction",
    "Client",
    "Conflict",
    "ExternalAction",
    "HeartbeatInfo",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "ItemInfo",
    "ItemSpec",
    "NotFound",
    "PayloadTooLarge",
    "RecordInfo",
    "ServerError",
    "StopInfo",
    "StopRequested",
    "StopWatch",
    "StopWatchInfo",
    "StopdeskError",
    "TaskClosed",
    "TaskDetail",
    "TaskInfo",
    "Unauthorized",
]
