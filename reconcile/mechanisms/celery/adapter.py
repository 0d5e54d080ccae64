"""Celery workers: cooperative cancellation through the ledger, revoke as an optimisation.

The task body (a `stopdesk.agent.workers.LedgerTask`) checks the ledger between steps and records
`cancelled` itself; nothing here can stop a running task. A revoke broadcast (never terminate)
saves the work of starting a task that is still queued or reserved; its revoked-id set lives in
worker memory and is lost on restart, so it is only an optimisation. The final state comes from
the ledger and the item's heartbeat; a worker that never answers is `uncertain` after the deadline.
"""

from __future__ import annotations

from django.utils import timezone

from reconcile.mechanisms.base import LEDGER_FINAL, Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen
from stopdesk.celery import app


class CeleryWorker(Mechanism):
    name = "celery"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})
    defaults = MechanismSettings(
        call_timeout_s=1.0,  # how long the revoke waits for worker replies
        deadline_s=600.0,
        backoff_initial_s=5.0,
        backoff_max_s=60.0,
        recheck_interval_s=5.0,
    )

    def cancel(self, item: ItemRef) -> Observation:
        replies: list[str] = []
        error = ""
        if item.handle:
            try:
                answers = app.control.revoke(item.handle, reply=True, timeout=self.settings.call_timeout_s) or []
                replies = sorted(host for answer in answers for host in answer)
            except Exception as exc:  # the broker being down must not stop reconciliation
                error = f"{type(exc).__name__}: {exc}"[:200]
        read_back = self.inspect(item)
        detail = {**read_back.detail, "revoke_acknowledged_by": replies}
        if error:
            detail["revoke_error"] = error
        return Observation(read_back.seen, read_back.remote_status, read_back.message, detail, cancel_sent=not error)

    def inspect(self, item: ItemRef) -> Observation:
        """The ledger is the worker's answer: the task body records its own end."""
        if item.state in LEDGER_FINAL:
            return Observation(LEDGER_FINAL[item.state], remote_status=f"ledger: {item.state}")
        now = timezone.now()
        detail = {
            "worker": item.worker,
            "heartbeat_at": item.heartbeat_at.isoformat() if item.heartbeat_at else None,
        }
        if item.lease_until is not None and item.lease_until > now:
            return Observation(
                Seen.RUNNING,
                remote_status="heartbeat fresh",
                message="The worker is alive and checks the ledger between steps.",
                detail=detail,
            )
        return Observation(
            Seen.UNREACHABLE, remote_status="no heartbeat", message="The worker is presumed lost.", detail=detail
        )


ADAPTER = CeleryWorker
