"""The readiness page lists each MCP tool declared per server in settings: with a status check it
can account for a cancelled or unanswered call; without one, such a call stays unknown."""

from __future__ import annotations

from typing import Any

from reconcile.mechanisms.base import ListedTool


def tools(options: dict[str, Any]) -> list[ListedTool]:
    servers = options.get("servers") or {}
    return [
        ListedTool(
            f"mcp:{server}/{tool}",
            {"mcp": {"server": server, "tool": tool}},
            without_inspect="no status check declared: a cancelled or unanswered call stays unknown",
        )
        for server in sorted(servers)
        for tool in sorted((servers[server] or {}).get("tools") or {})
    ]
