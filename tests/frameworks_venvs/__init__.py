"""Agent frameworks that cannot be installed beside the server, each in a venv of its own.

`make crewai-venv` builds `crewai/` from `crewai.lock` (crewai pins older `mcp` and `openai` majors
than the server's). A CrewAI agent there runs `stopdrill/crewai_child.py` and talks to a live
stopdesk server over HTTP, as a team's agent process would.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
CREWAI_PYTHON = HERE / "crewai" / "bin" / "python"
CREWAI_INSTALLED = HERE / "crewai" / ".installed"


def crewai_missing() -> bool:
    return not (CREWAI_PYTHON.exists() and CREWAI_INSTALLED.exists())
