"""stopdrill for agents built with a framework: each drill against a real OpenAI Agents SDK,
pydantic-ai, LangGraph and CrewAI run on the drill sandbox, with the same invariants as the mechanisms
(nothing after the boundary, every submitted action known or uncertain with a deadline)."""

from __future__ import annotations

import pytest

from stopdrill.drills.runner import run_drills
from stopdrill.drills.table import table

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(
    "framework",
    # CrewAI runs in its own venv and process (make crewai-venv), over HTTP.
    ["openai-agents", "pydantic-ai", "langgraph", "claude-agent-sdk", pytest.param("crewai", marks=pytest.mark.crewai)],
)
def test_every_drill_passes_for_the_framework(framework, drill_sandbox):
    report = run_drills(mechanisms=[framework], sandbox=drill_sandbox, store=False)

    assert report.passed, table(report)
    assert len(report.outcomes) == 7
    assert all(o.passed for o in report.outcomes), table(report)
    assert sum(o.after_boundary for o in report.outcomes) == 0
    assert sum(o.lost for o in report.outcomes) == 0
