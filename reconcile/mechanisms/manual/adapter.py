"""No route to cancel or inspect: the runtime (or a person) must report what happened.

The item waits in `awaiting_reconciliation` until a report arrives or the deadline passes, then it
is `uncertain` with an investigate-by deadline.
"""

from __future__ import annotations

from reconcile.mechanisms.base import ItemRef, Mechanism, MechanismSettings, Observation, Seen


class Manual(Mechanism):
    name = "manual"
    capabilities = frozenset()
    defaults = MechanismSettings(deadline_s=3600.0)

    def inspect(self, item: ItemRef) -> Observation:
        return Observation(
            Seen.AWAITING_REPORT, message="No cancel route for this mechanism; its result must be reported."
        )


ADAPTER = Manual
