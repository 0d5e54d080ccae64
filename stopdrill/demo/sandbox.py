"""Steering the sandbox for the demo, through its `/_control` routes (never the agent's own path).

`demo_task --stage done` asks for a finished task without waiting out the stand-in's run time:
this moves the stand-in's clock on for the given responses, as if a person had waited. The agent
still reads each response's real status through the Responses API afterwards.
"""

from __future__ import annotations

import httpx
from django.conf import settings


def _standin_root() -> str:
    base = str(settings.STOPDESK_MECHANISMS["openai"]["options"].get("base_url") or "").rstrip("/")
    return base.removesuffix("/v1")


def fast_forward_responses(response_ids: list[str]) -> None:
    root = _standin_root()
    if not root:
        return
    with httpx.Client(base_url=root, timeout=5.0) as http:
        for response_id in response_ids:
            http.post(f"/_control/responses/{response_id}/finish", json={"status": "completed"})


def configure_standin(*, run_s: float) -> None:
    """How long a background response takes to complete on the stand-in."""
    with httpx.Client(base_url=_standin_root(), timeout=5.0) as http:
        http.post("/_control/config", json={"run_s": run_s}).raise_for_status()
