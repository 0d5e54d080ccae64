"""The pure parts load without Django: checked in a fresh interpreter, where nothing else has
imported it first. (The full one-way rules are import-linter contracts, run by `make lint`.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("django", "celery", "kombu")


def loaded_after(statement: str) -> list[str]:
    probe = (
        f"import sys, json\n{statement}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "statement",
    [
        "import stopdesk.client",
        "import stopdesk.protocol.errors, stopdesk.protocol.types, stopdesk.protocol.action",
        "from stopdesk.client import Client, AsyncClient, StopRequested",
        "import reconcile.engine",
        "import stopdesk.states",
    ],
)
def test_the_pure_parts_load_without_django_or_celery(statement):
    assert loaded_after(statement) == []


def test_the_probe_sees_django_when_it_is_loaded():
    # The check above can fail: importing the ledger's models does load Django.
    assert "django" in loaded_after("import django.conf")
