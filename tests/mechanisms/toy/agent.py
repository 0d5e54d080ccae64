"""The toy's agent helper: pass the boundary with the job's key, then start the job."""

from __future__ import annotations

import time

import httpx

from stopdesk.services.items import item_finish
from stopdesk.services.transitions import item_submit


def toy_run(*, item_id: int, key: str, base_url: str, actor: str) -> str:
    item_submit(item_id=item_id, idempotency_key=key, actor=actor)  # raises once Stop committed
    httpx.post(f"{base_url}/jobs", headers={"Idempotency-Key": key}, timeout=2.0)
    while (status := httpx.get(f"{base_url}/jobs/{key}", timeout=2.0).json()["status"]) == "running":
        time.sleep(0.02)
    if status == "completed":
        item_finish(item_id=item_id, succeeded=True, actor=actor)
    return status
