"""Two real web worker processes (gunicorn -w 2, as deployed) share one sign-in count: the sixth
wrong password is refused no matter which process answers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stopdrill.launcher import free_port
from tests.run.helpers import PYTHON, ROOT, clean_env, run


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    env = clean_env(Path(tmp_path_factory.mktemp("signin")))
    assert run(["manage.py", "migrate", "--noinput"], env, timeout=180).returncode == 0
    assert run(["manage.py", "create_demo_users"], env).returncode == 0
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "stopdesk.wsgi:application", "-b", f"127.0.0.1:{port}", "-w", "2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/login/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def _attempt(url: str, username: str, password: str) -> int:
    # A new connection each time: the two workers take turns accepting them.
    with httpx.Client(base_url=url, timeout=10) as client:
        page = client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        answer = client.post(
            "/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token[1]},
            headers={"Referer": url + "/login/"},
        )
        return answer.status_code


@pytest.mark.parametrize("username", ["operator", "reviewer", "approver"])
def test_the_sixth_wrong_password_is_refused_across_two_processes(two_workers, username) -> None:  # type: ignore[no-untyped-def]
    answers = [_attempt(two_workers, username, "wrong") for _ in range(6)]
    assert answers == [200] * 5 + [429], answers
