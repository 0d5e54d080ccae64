"""The mechanisms: one folder each under reconcile/mechanisms/, one line each in `FOLDERS`.

A folder holds everything one way of cancelling needs, top of the stack to bottom:

- `adapter.py`: the `Mechanism` subclass (cancel, inspect, reverse: I/O against its system only),
  named `ADAPTER`;
- `agent.py` (or an `agent/` package): the helper an agent's code calls to start such work;
- `readiness.py`: the tools it lists on the readiness page beyond the mechanism itself
  (`tools(options)`);
- `sandbox.py`: its stand-in for the outside system, served on 127.0.0.1 (`PARTY`, `PARTY_NAME`,
  `URL_SUFFIX`);
- `drill.py`: the driver the drills run it with, named `DRIVER`.

Everything else is derived from this table: the names settings accept
(`stopdesk.config.MECHANISMS`), the adapter registry, the sandbox's parties, the drills' drivers,
the readiness listing, and the table of mechanisms in docs/ARCHITECTURE.md (a test compares them).
This module is plain Python (settings import it before Django is set up), and a part is imported
on first use only, so naming a mechanism loads no SDK.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

# In this order the sandbox serves the folders' parties on consecutive ports (`make run`: OpenAI
# on 8001, MCP on 8002, the CRM on 8003), before the parties no mechanism owns.
FOLDERS: dict[str, str] = {
    "openai": "reconcile.mechanisms.openai",
    "mcp": "reconcile.mechanisms.mcp",
    "http": "reconcile.mechanisms.http",
    "asyncio": "reconcile.mechanisms.asyncio",
    "celery": "reconcile.mechanisms.celery",
    "manual": "reconcile.mechanisms.manual",
}
PARTS = ("adapter", "agent", "readiness", "sandbox", "drill")
HERE = Path(__file__).resolve().parent
# Folders added at run time (a test's toy mechanism), as a line in FOLDERS would add them.
_ADDED: dict[str, str] = {}


def add(name: str, package: str) -> None:
    """List a folder outside this package under `name`: what a line in `FOLDERS` does."""
    if name in FOLDERS or _ADDED.get(name, package) != package:
        raise ValueError(f"A mechanism named {name!r} is already listed.")
    _ADDED[name] = package


def remove(name: str) -> None:
    _ADDED.pop(name, None)


def names() -> list[str]:
    return sorted({*FOLDERS, *_ADDED})


def listed() -> list[str]:
    """The names in the order of their lines (added folders last)."""
    return [*FOLDERS, *(name for name in _ADDED if name not in FOLDERS)]


def package(name: str) -> str | None:
    return FOLDERS.get(name) or _ADDED.get(name)


def part(name: str, which: str) -> ModuleType | None:
    """The folder's `which` part (one of `PARTS`), imported now; None when the folder has none."""
    where = package(name)
    if where is None:
        raise LookupError(f"No mechanism folder is listed as {name!r}.")
    module = f"{where}.{which}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as missing:
        if missing.name != module:
            raise  # the part exists and something it imports does not
        return None


def unlisted(root: Path = HERE, listed: dict[str, str] | None = None) -> list[str]:
    """Folders under `root` with an adapter.py and no line in `FOLDERS`, each said as the fix."""
    packages = set((FOLDERS if listed is None else listed).values())
    base = "reconcile.mechanisms"
    return [
        f"{root / folder.name} has an adapter.py but no line in reconcile/mechanisms/folders.py: "
        f'add `"{folder.name}": "{base}.{folder.name}",` to FOLDERS'
        for folder in sorted(root.iterdir())
        if (folder / "adapter.py").is_file() and f"{base}.{folder.name}" not in packages
    ]
