"""The configuration file, STOPDESK_CONFIG_FILE: named MCP servers, external systems and mechanism
options in TOML, for a deployment that has no settings module of its own (the compose file mounts
one).

    [mechanisms.openai]            # a mechanism's timing and options
    deadline_s = 120
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"

    [mcp.servers.research]         # a named MCP server (reconcile/mechanisms/mcp/servers.py)
    url = "https://tools.example/mcp"
    bearer_token_env = "RESEARCH_MCP_TOKEN"
    headers_env = { "X-Api-Key" = "RESEARCH_MCP_KEY" }

    [http.systems.billing]         # an external system (reconcile/mechanisms/http/adapter.py)
    base_url = "https://billing.example"
    lookup_url = "/invoices?idempotency_key={idempotency_key}"

The file is read once, by settings, and merged over the settings' own values the way
`STOPDESK_MECHANISMS` overrides each adapter's defaults: a mechanism's keys replace the same keys,
a server or a system replaces the one of the same name whole, and the STOPDESK_<MECHANISM>_*
timing variables still win over the file. Secrets are never written in the file: it names the
environment variable that holds each one (`*_env`), read here at start-up. Every mistake (a key that
does not exist, a wrong type, a URL that is not http(s), an unset variable) raises `ConfigError`,
one line naming the file and the key.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from typing import Any
from urllib.parse import urlsplit

from stopdesk.config import MECHANISMS, ConfigError

VARIABLE = "STOPDESK_CONFIG_FILE"

# Every field of reconcile.mechanisms.base.MechanismSettings but `options` (a test keeps the two
# the same; the kit sits below the adapters, so it cannot read the dataclass).
TIMING_KEYS: dict[str, str] = {
    "call_timeout_s": "seconds",
    "deadline_s": "seconds",
    "backoff_initial_s": "seconds",
    "backoff_max_s": "seconds",
    "recheck_interval_s": "seconds",
    "recheck_after_cancelled_s": "seconds or 0",
    "watch_first_s": "seconds",
    "watch_growth": "factor",
    "investigate_by_hours": "hours",
    "concurrency": "count",
}
# The options each adapter reads (servers and systems have tables of their own). `*_env` names the
# variable holding a secret; the option gets its value.
OPTION_KEYS: dict[str, dict[str, str]] = {
    "openai": {"base_url": "url", "api_key_env": "env"},
    "mcp": {"after_cancel_s": "seconds"},
}
MCP_SERVER_KEYS = {
    "url": "url",
    "command": "text",
    "args": "list",
    "cwd": "text",
    "bearer_token_env": "env",
    "headers_env": "env-table",
    "env_from": "env-table",
    "tools": "table",
    "revision": "revision",
    "trusted": "true/false",
}
# The MCP revisions a server may be pinned to, or "auto" (the newest it offers).
MCP_REVISIONS = ("auto", "2026-07-28", "2025-11-25")
# What may be declared of one tool of a server: its status check, and whether repeating it is harmless.
TOOL_KEYS = {"status_check": "table", "idempotent": "true/false", "task": "true/false"}
CHECK_KEYS = {"tool": "text", "arguments": "table", "completed_if_contains": "text"}
SECRET_HINTS = {
    "bearer_token": "bearer_token_env",
    "headers": "headers_env",
    "env": "env_from",
    "api_key": "api_key_env",
}
SYSTEM_KEYS = {
    "base_url": "url",
    "lookup_url": "path",
    "record_url": "path",
    "cancel_url": "path",
    "id_field": "text",
    "version_field": "text",
    "reverse": "table",
}
REVERSE_KEYS = {"action": "text", "label": "text", "url": "path", "if_match": "text", "method": "text"}
TOP_LEVEL = ("mechanisms", "mcp", "http")


class _File:
    """One file's checks: each error names the file and the dotted key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, key: str, what: str) -> ConfigError:
        where = f"{self.path}: {key}" if key else self.path
        return ConfigError(f"{VARIABLE} {where}: {what}")

    def table(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {_kind(value)}.")
        return value

    def known(self, table: dict[str, Any], allowed: dict[str, str] | tuple[str, ...], key: str) -> None:
        for name in table:
            if name in allowed:
                continue
            dotted = f"{key}.{name}" if key else name
            if name in SECRET_HINTS and SECRET_HINTS[name] in allowed:
                raise self.error(
                    dotted,
                    f"secrets are not written in the file; name the environment variable that holds it with {SECRET_HINTS[name]!r}.",
                )
            choices = ", ".join(sorted(allowed))
            raise self.error(dotted, f"there is no such key; use one of {choices}.")

    def value(self, value: Any, kind: str, key: str) -> Any:
        if kind in ("seconds", "seconds or 0", "hours", "factor"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise self.error(key, f"expected a number ({kind}), got {_kind(value)}.")
            if kind == "factor" and value < 1:
                raise self.error(key, f"{value} must be at least 1.")
            if kind == "seconds or 0" and value < 0:
                raise self.error(key, f"{value} must be at least 0.")
            if kind in ("seconds", "hours") and value <= 0:
                raise self.error(key, f"{value} must be more than 0.")
            return float(value)
        if kind == "count":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.error(key, f"expected a whole number of at least 1, got {value!r}.")
            return value
        if kind == "list":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.error(key, f"expected a list of strings, got {_kind(value)}.")
            return list(value)
        if kind == "table":
            return copy.deepcopy(self.table(value, key))
        if kind == "true/false":
            if not isinstance(value, bool):
                raise self.error(key, f"expected true or false, got {_kind(value)}.")
            return value
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_kind(value)}.")
        if kind == "url":
            self.url(value, key)
        elif kind == "path" and not value.startswith("/"):
            self.url(value, key, relative="; or a path starting with / (joined to base_url)")
        elif kind == "env":
            return self.secret(value, key)
        elif kind == "revision" and value not in MCP_REVISIONS:
            raise self.error(key, f"{value!r} is not a revision; use one of {', '.join(MCP_REVISIONS)}.")
        return value

    def url(self, value: str, key: str, relative: str = "") -> None:
        try:
            parts = urlsplit(value)
            host = parts.hostname
        except ValueError:
            host = None
        if not host or parts.scheme not in ("http", "https"):
            raise self.error(key, f"{value!r} is not an http(s) URL (http://HOST/...){relative}.")

    def secret(self, variable: str, key: str) -> str:
        found = os.environ.get(variable, "")
        if not found:
            raise self.error(key, f"names the environment variable {variable}, which is not set.")
        return found

    def env_table(self, value: Any, key: str) -> dict[str, str]:
        return {str(name): self.secret(str(var), f"{key}.{name}") for name, var in self.table(value, key).items()}


def _kind(value: Any) -> str:
    names = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def read(path: str) -> dict[str, dict[str, Any]]:
    """The file's overrides, shaped like settings.STOPDESK_MECHANISMS ({mechanism: {field: value,
    "options": {...}}}), with every secret read from its variable. Raises ConfigError."""
    f = _File(path)
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise f.error("", "the file does not exist.") from None
    except OSError as exc:
        raise f.error("", f"cannot be read ({exc.strerror}).") from None
    except tomllib.TOMLDecodeError as exc:
        raise f.error("", f"is not valid TOML ({exc}).") from None
    f.known(raw, TOP_LEVEL, "")
    found: dict[str, dict[str, Any]] = {}

    for name, table in f.table(raw.get("mechanisms", {}), "mechanisms").items():
        key = f"mechanisms.{name}"
        if name not in MECHANISMS:
            raise f.error(key, f"there is no mechanism called {name!r}; use one of {', '.join(MECHANISMS)}.")
        options = OPTION_KEYS.get(name, {})
        f.known(f.table(table, key), {**TIMING_KEYS, **options}, key)
        entry = found.setdefault(name, {})
        for field, value in table.items():
            if field in TIMING_KEYS:
                entry[field] = f.value(value, TIMING_KEYS[field], f"{key}.{field}")
            else:
                option = field.removesuffix("_env") if options[field] == "env" else field
                entry.setdefault("options", {})[option] = f.value(value, options[field], f"{key}.{field}")

    mcp = f.table(raw.get("mcp", {}), "mcp")
    f.known(mcp, ("servers",), "mcp")
    for name, table in f.table(mcp.get("servers", {}), "mcp.servers").items():
        key = f"mcp.servers.{name}"
        f.known(f.table(table, key), MCP_SERVER_KEYS, key)
        if ("url" in table) == ("command" in table):
            raise f.error(key, "give exactly one of 'url' (Streamable HTTP) or 'command' (stdio).")
        server: dict[str, Any] = {}
        for field, value in table.items():
            kind = MCP_SERVER_KEYS[field]
            if field == "bearer_token_env":
                f.value(value, "env", f"{key}.{field}")  # set? servers.py reads it when it connects
                server[field] = value
            elif kind == "env-table":
                server["headers" if field == "headers_env" else "env"] = f.env_table(value, f"{key}.{field}")
            else:
                server[field] = f.value(value, kind, f"{key}.{field}")
        for tool, declared in (server.get("tools") or {}).items():
            where = f"{key}.tools.{tool}"
            f.known(f.table(declared, where), TOOL_KEYS, where)
            for flag in ("idempotent", "task"):
                if flag in declared:
                    f.value(declared[flag], TOOL_KEYS[flag], f"{where}.{flag}")
            check = f.table(declared.get("status_check", {}), f"{where}.status_check")
            f.known(check, CHECK_KEYS, f"{where}.status_check")
            for field, value in check.items():
                f.value(value, CHECK_KEYS[field], f"{where}.status_check.{field}")
            if check and not check.get("tool"):
                raise f.error(f"{where}.status_check", "a status check needs the 'tool' that reads the call's effect.")
        found.setdefault("mcp", {}).setdefault("options", {}).setdefault("servers", {})[name] = server

    http = f.table(raw.get("http", {}), "http")
    f.known(http, ("systems",), "http")
    for name, table in f.table(http.get("systems", {}), "http.systems").items():
        key = f"http.systems.{name}"
        f.known(f.table(table, key), SYSTEM_KEYS, key)
        if "base_url" not in table:
            raise f.error(key, "a system needs its 'base_url' (http(s)://HOST).")
        system = {field: f.value(value, SYSTEM_KEYS[field], f"{key}.{field}") for field, value in table.items()}
        if "reverse" in system:
            reverse = system["reverse"]
            f.known(reverse, REVERSE_KEYS, f"{key}.reverse")
            for field, value in reverse.items():
                f.value(value, REVERSE_KEYS[field], f"{key}.reverse.{field}")
            if not reverse.get("action") or not reverse.get("url"):
                raise f.error(f"{key}.reverse", "a reversal needs its 'action' and its 'url'.")
        found.setdefault("http", {}).setdefault("options", {}).setdefault("systems", {})[name] = system
    return found


def merged(
    mechanisms: dict[str, dict[str, Any]], path: str, *, environment: dict[str, dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """`mechanisms` (the settings' STOPDESK_MECHANISMS) with the file's overrides over it, and the
    STOPDESK_<MECHANISM>_* timing variables (`environment`) over those. A new dict."""
    result = copy.deepcopy(mechanisms)
    for name, overrides in read(path).items():
        entry = result.setdefault(name, {})
        options = overrides.pop("options", {})
        entry.update(overrides)
        target = entry.setdefault("options", {})
        for option, value in options.items():
            if option in ("servers", "systems"):
                target[option] = {**(target.get(option) or {}), **value}
            else:
                target[option] = value
    for name, timings in environment.items():
        result.setdefault(name, {}).update(timings)
    return result


def path() -> str | None:
    """STOPDESK_CONFIG_FILE, or None when it is unset (the settings alone, as before)."""
    return os.environ.get(VARIABLE, "").strip() or None
