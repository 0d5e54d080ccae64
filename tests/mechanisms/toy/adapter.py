"""The toy's adapter: its jobs server cancels a job by key and says how each job ended."""

from __future__ import annotations

import httpx

from reconcile.mechanisms.base import Capability, ItemRef, Mechanism, MechanismSettings, Observation, Seen

SEEN = {"running": Seen.RUNNING, "cancelled": Seen.CANCELLED, "completed": Seen.COMPLETED}


class ToyJobs(Mechanism):
    name = "toy"
    capabilities = frozenset({Capability.CANCEL, Capability.INSPECT})
    defaults = MechanismSettings(call_timeout_s=1.0, deadline_s=5.0)

    def _call(self, method: str, item: ItemRef, path: str = "") -> Observation:
        url = f"{self.settings.options['base_url']}/jobs/{item.idempotency_key}{path}"
        try:
            answer = httpx.request(method, url, timeout=self.settings.call_timeout_s)
        except httpx.HTTPError as exc:
            return Observation(Seen.UNREACHABLE, message=str(exc))
        if answer.status_code == 404:
            return Observation(Seen.NO_EFFECT, remote_status="404: the job never landed")
        status = answer.json()["status"]
        return Observation(SEEN[status], remote_status=status)

    def cancel(self, item: ItemRef) -> Observation:
        return self._call("POST", item, "/cancel")

    def inspect(self, item: ItemRef) -> Observation:
        return self._call("GET", item)


ADAPTER = ToyJobs
