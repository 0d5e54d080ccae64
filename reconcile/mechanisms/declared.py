"""What a runtime may declare about an item, and what it may not.

Where the server sends requests and credentials is configuration, never runtime input. A runtime
(an agent that may be buggy, prompt-injected or compromised) may *name* a configured entry (an
http `system`, an MCP `server`) and supply ids and versions; it may never give a URL, host, base
URL, header, command or credential that the server would then use. The adapters only read the
configuration; this module refuses, at every door (the runtime API and the in-process services
alike), a declaration that tries more, naming the field, so the runtime learns at once instead of
having its override silently ignored.

The sections checked are the ones adapters read: `detail["http"]`, `detail["openai"]` and
`detail["mcp"]`. An MCP item's `url` and `command` are facts the agent side records about where
*it* went (`ServerSpec.public()`): shown to people, never dialled or run by the server, which
reaches only the configured server of that name. A tool call's own `arguments` (and a server's
`annotations` of its tool) are the call's data, never read as configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What an http item may say: which configured system the operation belongs to, and its effect.
HTTP_KEYS = frozenset({"system", "effect"})
# Keys that would steer where the server connects, with what, or as whom.
STEERING = frozenset(
    {
        "url",
        "uri",
        "base_url",
        "host",
        "hostname",
        "port",
        "scheme",
        "endpoint",
        "server_url",
        "redirect",
        "redirects",
        "follow_redirects",
        "proxy",
        "proxies",
        "headers",
        "header",
        "default_headers",
        "authorization",
        "auth",
        "api_key",
        "bearer_token",
        "bearer_token_env",
        "token",
        "access_token",
        "client_secret",
        "password",
        "secret",
        "cookies",
        "organization",
        "project",
        "command",
        "args",
        "env",
        "cwd",
        "reverse",
        "lookup",
        "system_config",
    }
)
# Recorded facts about where the agent side itself went; never used by the server.
MCP_FACTS = frozenset({"url", "command", "args"})
# Subtrees that are a call's own data, not configuration.
DATA_KEYS = frozenset({"arguments", "annotations"})


@dataclass(frozen=True)
class Refusal:
    field: str  # "detail.openai.base_url"
    message: str


def steering_problem(detail: Any) -> Refusal | None:
    """The first field of `detail` that tries to choose where the server connects, or None."""
    if not isinstance(detail, dict):
        return None
    http = detail.get("http")
    if http is not None:
        if not isinstance(http, dict):
            return Refusal("detail.http", 'must be an object naming a configured system, e.g. {"system": "crm"}')
        for key in http:
            if key not in HTTP_KEYS:
                return _refused(f"detail.http.{key}", key, 'the configured system (name it with "system")')
        if not isinstance(http.get("system", ""), str) or not isinstance(http.get("effect", ""), str):
            return Refusal("detail.http.system", "must be a string naming a configured system")
    for section, facts in (("openai", frozenset[str]()), ("mcp", MCP_FACTS)):
        found = _steering(detail.get(section), f"detail.{section}", facts)
        if found is not None:
            return found
    return None


def _steering(value: Any, path: str, facts: frozenset[str]) -> Refusal | None:
    if isinstance(value, list):
        for i, each in enumerate(value):
            if (found := _steering(each, f"{path}.{i}", frozenset())) is not None:
                return found
        return None
    if not isinstance(value, dict):
        return None
    for key, inner in value.items():
        name = str(key)
        if name in DATA_KEYS or name in facts:
            continue
        if _is_steering(name):
            return _refused(f"{path}.{name}", name, "configuration")
        if (found := _steering(inner, f"{path}.{name}", frozenset())) is not None:
            return found
    return None


def _is_steering(key: str) -> bool:
    lowered = key.lower()
    return lowered in STEERING or lowered.endswith(("_url", "_uri", "_host", "_headers"))


def _refused(field: str, key: str, where: str) -> Refusal:
    return Refusal(
        field,
        f"{key!r} cannot be set by a runtime: where the server sends requests and credentials comes "
        f"from {where}, never from an item's declaration.",
    )
