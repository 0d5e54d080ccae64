"""asyncio children: the adapter that reads back what the supervisor recorded.

The supervisor (`stopdesk.agent.aio.supervise`) runs in the agent's own process and records each
child's outcome in the ledger; nothing outside that process can cancel a coroutine, so this adapter
can only inspect.
"""

from __future__ import annotations

from django.utils import timezone

from reconcile.mechanisms.base import LEDGER_FINAL, Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen
from stopdesk.states import ItemState


class AsyncioChild(Mechanism):
    """The supervisor records outcomes in the ledger; this adapter reads them back. An external
    action the child declared (detail["http"]) is looked up through the HTTP adapter."""

    name = "asyncio"
    capabilities = frozenset({Capability.INSPECT})
    # A child's action that was not found may still land, as with HTTP operations: keep watching
    # a `cancelled` for the same window, so a late landing becomes a late result for review.
    defaults = MechanismSettings(
        call_timeout_s=10.0,
        deadline_s=300.0,
        recheck_interval_s=5.0,
        backoff_initial_s=2.0,
        recheck_after_cancelled_s=300.0,
    )

    def inspect(self, item: ItemRef) -> Observation:
        if item.submitted_at is not None and item.detail.get("http"):
            # The remote side first, even when the ledger already says cancelled: the watch after
            # `cancelled` exists to see an action that lands late, and the ledger is our own claim.
            return self.peer("http").inspect(item)
        if item.state in LEDGER_FINAL:
            return Observation(LEDGER_FINAL[item.state], remote_status=f"ledger: {item.state}")
        if item.state == ItemState.RUNNING and item.lease_until is not None and item.lease_until > timezone.now():
            return Observation(Seen.RUNNING, remote_status="heartbeat fresh")
        if item.submitted_at is not None:
            return Observation(
                Seen.UNKNOWABLE,
                remote_status="no lookup",
                message="The coroutine was cancelled after sending an external action that has no status lookup.",
            )
        return Observation(Seen.AWAITING_REPORT, remote_status="no heartbeat")


ADAPTER = AsyncioChild
