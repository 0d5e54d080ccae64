"""Reconcile's side of the ledger's ports (`stopdesk.ports`): what the ledger calls, registered by
`ReconcileConfig.ready()`."""

from __future__ import annotations

from reconcile.readiness import registration_check
from reconcile.selectors import tasks_with_open_work
from reconcile.tasks import cancellations_dispatch
from stopdesk import ports


def ports_register() -> None:
    ports.cancellations_dispatch.register(cancellations_dispatch)
    ports.registration_check.register(registration_check)
    ports.tasks_with_open_work.register(tasks_with_open_work)
