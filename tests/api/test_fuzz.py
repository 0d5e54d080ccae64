"""Property-based fuzzing of the OpenAPI document with schemathesis: over a thousand generated
requests (valid and invalid) across every endpoint, against real PostgreSQL. No answer is a 5xx, each
conforms to the document, and a refused request writes nothing."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from urllib.parse import urlencode

import httpx
import pytest
import schemathesis
from django.test import Client as DjangoClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from stopdesk.api.openapi import document
from stopdesk.services.items import task_create
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState as S
from tests.api.conftest import ledger_counts
from tests.factories import make_item

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.slow]

REQUESTS = 1100
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
STATES = [S.QUEUED, S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED, S.AWAITING_RECONCILIATION, S.UNCERTAIN]


BASE = "http://testserver/api/v1"


@pytest.fixture(scope="module")
def schema():  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_dict(document())


def _send(http: DjangoClient, case, token: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    """Send a generated case through Django's test client (inside the test's transaction, so row counts
    are exact) and hand the answer back as an httpx response for schemathesis's checks."""
    kw = case.as_transport_kwargs(base_url=BASE, headers={"Authorization": f"Bearer {token}"})
    url = kw["url"].removeprefix("http://testserver") + ("?" + urlencode(kw["params"]) if kw.get("params") else "")
    body = json.dumps(kw["json"]).encode() if "json" in kw else (kw.get("data") or b"")
    if isinstance(body, str):
        body = body.encode()
    headers = {k: v for k, v in kw["headers"].items() if k.lower() not in ("content-type", "content-length", "host")}
    content_type = kw["headers"].get("Content-Type", "application/json")
    started = time.perf_counter()
    answer = http.generic(kw["method"], url, data=body, content_type=content_type, headers=headers)
    response = httpx.Response(
        answer.status_code,
        headers=list(answer.headers.items()),
        content=answer.content,
        request=httpx.Request(kw["method"], kw["url"]),
    )
    response.elapsed = timedelta(seconds=time.perf_counter() - started)
    return response


def test_generated_requests_never_fail_the_server_and_rejected_ones_write_nothing(schema, runtime, other_runtime):
    cases = schema.as_strategy(generation_mode=GenerationMode.POSITIVE) | schema.as_strategy(
        generation_mode=GenerationMode.NEGATIVE
    )
    sent: list[int] = []
    http = DjangoClient()

    @settings(max_examples=REQUESTS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases, data=st.data())
    def one_request(case, data):  # type: ignore[no-untyped-def]
        # Point most requests at real ids (ours in some state, or another runtime's), so generated bodies
        # reach the ledger rather than stopping at 404.
        target = data.draw(st.sampled_from(["ours", "ours", "ours", "theirs", "generated"]))
        if target != "generated" and case.path_parameters:
            owner = runtime[0] if target == "ours" else other_runtime[0]
            task = task_create(title="fuzz", actor="test", runtime=owner)
            item = make_item(task, state=data.draw(st.sampled_from(STATES)))
            if data.draw(st.booleans(), label="stopped"):
                task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
            case.path_parameters = {name: (task.pk if name == "task_id" else item.pk) for name in case.path_parameters}
        before = ledger_counts()
        response = _send(http, case, runtime[1])
        sent.append(response.status_code)
        case.validate_response(response, checks=CHECKS)
        assert response.status_code < 500
        body = response.json()
        if response.status_code >= 400 and body.get("error") != "task_stopped":
            assert ledger_counts() == before, (case.method, case.formatted_path, response.status_code, body)

    one_request()
    assert len(sent) >= 1000
    # The run reached the ledger, not only the validators.
    assert {200, 201, 404, 409, 422} <= set(sent), sorted(set(sent))
