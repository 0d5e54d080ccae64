"""A mechanism added the documented way (one folder, one line in the list) is served by the
sandbox, judged by the registry, and drilled: nothing lost, nothing after the boundary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reconcile.mechanisms import folders, registry
from stopdrill.drills.runner import run_drills
from stopdrill.drills.sandbox import DrillSandbox, start_drill_sandbox
from stopdrill.drills.table import table

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def toy() -> Iterator[str]:
    folders.add("toy", "tests.mechanisms.toy")  # what `"toy": "tests.mechanisms.toy",` in FOLDERS does
    registry.reset()
    yield "toy"
    folders.remove("toy")
    registry.reset()


@pytest.fixture
def toy_sandbox(toy: str) -> Iterator[DrillSandbox]:
    sandbox = start_drill_sandbox()
    yield sandbox
    sandbox.stop()


def test_the_toy_folder_is_a_mechanism_once_listed(toy: str) -> None:
    assert toy in registry.names()
    assert registry.adapter_class(toy).name == toy
    assert [part for part in folders.PARTS if folders.part(toy, part) is not None] == [
        "adapter",
        "agent",
        "sandbox",
        "drill",
    ]


def test_the_toy_mechanism_passes_its_drills_with_nothing_lost(toy: str, toy_sandbox: DrillSandbox) -> None:
    assert "toy" in toy_sandbox.urls
    report = run_drills(
        mechanisms=[toy],
        drills=["before_dispatch", "during_tool_call"],
        sandbox=toy_sandbox,
        store=False,
        settings_overrides={"toy": {"options": {"base_url": toy_sandbox.urls["toy"]}}},
    )
    assert [o.verdict for o in report.outcomes] == ["pass", "pass"], table(report)
    totals = report.totals()
    assert totals["lost"] == 0 and totals["after_boundary"] == 0
    assert totals["external_actions"] >= 1
