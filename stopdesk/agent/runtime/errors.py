"""The services' refusals as the errors both doors raise (`stopdesk.protocol.errors`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from stopdesk.protocol.errors import Conflict, InvalidRequest, StopRequested
from stopdesk.protocol.errors import TaskClosed as ClientTaskClosed
from stopdesk.services.errors import (
    DeclarationRefused,
    HandleConflict,
    IllegalTransition,
    TaskClosed,
    TaskStopped,
    ToolNotReady,
    UnknownMechanism,
)


@contextlib.contextmanager
def ledger_errors() -> Iterator[None]:
    """Translate the services' refusals into the errors both doors raise."""
    try:
        yield
    except TaskStopped as exc:
        raise StopRequested(str(exc), task=exc.task_id, item=exc.item_id) from exc
    except TaskClosed as exc:
        raise ClientTaskClosed(str(exc), task=exc.extra.get("task")) from exc
    except IllegalTransition as exc:
        raise Conflict(str(exc), state=exc.current, item=exc.item_id) from exc
    except ToolNotReady as exc:
        raise InvalidRequest(str(exc), code=exc.code, field="mechanism", tool=exc.tool, missing=exc.missing) from exc
    except UnknownMechanism as exc:
        raise InvalidRequest(str(exc), code=exc.code, field="mechanism") from exc
    except HandleConflict as exc:
        raise Conflict(str(exc), code=exc.code, field="handle", item=exc.item_id, handle=exc.handle) from exc
    except DeclarationRefused as exc:
        raise InvalidRequest(str(exc), code=exc.code, field=exc.field) from exc
