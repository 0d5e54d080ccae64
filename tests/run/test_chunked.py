"""A request body sent with Transfer-Encoding: chunked is read, or refused with 411 and nothing
written; never accepted as empty. Against gunicorn (what `make run` and the container serve with)
and Django's test live server."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stopdrill.launcher import free_port
from tests.run.helpers import PYTHON, ROOT, clean_env, run


def _chunked(port: int, path: str, body: dict, token: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    """POST `body` in several chunks (split mid-token) and read the answer.

    The whole request goes out in one write on a raw socket: a server that refuses chunked
    bodies may answer from the headers alone and close while a client that writes chunk by chunk
    (http.client does) is still sending, and that client then fails with a broken pipe before it
    reads the answer. Answering early is allowed HTTP, so the answer is read whatever the peer did
    with the rest of the body."""
    raw = json.dumps(body).encode()
    chunks = [raw[i : i + 7] for i in range(0, len(raw), 7)]  # several chunks, split mid-token
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = (
        f"POST /api/v1{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # If it answered and closed before taking the whole body, its answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + encoded)
        response = http.client.HTTPResponse(sock)
        response.begin()
        status, text = response.status, response.read()
    return status, json.loads(text) if text else {}


def _plain(port: int, path: str, body: dict, token: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST",
        "/api/v1" + path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    status, text = response.status, response.read()
    conn.close()
    return status, json.loads(text)


@pytest.fixture(scope="module")
def gunicorn(tmp_path_factory) -> Iterator[tuple[int, str]]:  # type: ignore[no-untyped-def]
    data = tmp_path_factory.mktemp("chunked")
    env = clean_env(Path(data))
    assert run(["manage.py", "migrate", "--noinput"], env, timeout=180).returncode == 0
    made = run(["manage.py", "create_runtime_token", "chunky"], env)
    token = next(w for w in made.stdout.split() if w.startswith("sd_"))
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "stopdesk.wsgi:application", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
                break
            except OSError:
                time.sleep(0.2)
        yield port, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_gunicorn_reads_a_chunked_body(gunicorn) -> None:  # type: ignore[no-untyped-def]
    port, token = gunicorn
    status, task = _chunked(port, "/tasks", {"title": "Sent in chunks"}, token)
    assert status == 201 and task["title"] == "Sent in chunks"
    _, item = _plain(port, f"/tasks/{task['id']}/items", {"kind": "external_operation", "noun": "record"}, token)
    assert _plain(port, f"/items/{item['id']}/start", {}, token)[0] == 200
    status, uncertain = _chunked(
        port, f"/items/{item['id']}/uncertain", {"detail": "CRM timed out", "evidence": {"timeout_s": 10}}, token
    )
    assert status == 200 and uncertain["outcome"] == "CRM timed out"
    assert uncertain["evidence"] == {"timeout_s": 10, "uncertain_because": "CRM timed out"}


@pytest.mark.django_db(transaction=True)
def test_a_server_that_cannot_decode_chunks_answers_411_and_writes_nothing(live_server) -> None:  # type: ignore[no-untyped-def]
    from stopdesk.services.runtimes import runtime_create
    from tests.api.conftest import ledger_counts

    token = runtime_create(name="chunky", actor="test")[1]
    port = int(live_server.url.rsplit(":", 1)[1])
    before = ledger_counts()
    status, body = _chunked(port, "/tasks", {"title": "Sent in chunks"}, token)
    assert status == 411 and body["error"] == "length_required"
    assert ledger_counts() == before
