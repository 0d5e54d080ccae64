"""A server process loads its views before it serves: its first request (which may be a Stop)
imports none of them, where it used to import every view and the OpenAI SDK, about a second."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FIRST_REQUEST = """
import json, sys
import {module}
from django.test import Client
loaded = set(sys.modules)
status = Client().get("/api/v1/tasks/1").status_code
print(json.dumps({{"status": status, "imported": sorted(set(sys.modules) - loaded)}}))
"""


@pytest.mark.parametrize("module", ["stopdesk.wsgi", "stopdesk.asgi"])
def test_a_server_process_serves_its_first_request_without_importing(module):
    done = subprocess.run(
        [sys.executable, "-c", FIRST_REQUEST.format(module=module)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["status"] == 401  # served: no token
    # Django's per-request pieces (the messages' storage) may still load then; no view may.
    views = [name for name in answer["imported"] if name.split(".")[0] in ("stopdesk", "reconcile", "openai", "mcp")]
    assert views == [], answer["imported"]
