"""The readiness page lists each HTTP system configured in settings on its own line."""

from __future__ import annotations

from typing import Any

from reconcile.mechanisms.base import ListedTool


def tools(options: dict[str, Any]) -> list[ListedTool]:
    systems = options.get("systems") or {}
    return [ListedTool(f"http:{system}", {"http": {"system": system}}) for system in sorted(systems)]
