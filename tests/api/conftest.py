"""Runtimes with tokens, a JSON client that speaks the API, and row counts for "wrote nothing"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test import Client as DjangoClient

import stopdesk.admin_runtime  # noqa: F401 - registers the Runtime admin before the URLconf loads
from stopdesk.models import ApiIdempotency, Event, ExternalRecord, StopRequest, Task, WorkItem
from stopdesk.services.runtimes import runtime_create

LEDGER = (Task, WorkItem, Event, ExternalRecord, StopRequest, ApiIdempotency)


def ledger_counts() -> dict[str, int]:
    """Row counts of every table a request could write, in one query."""
    sql = "SELECT " + ", ".join(f"(SELECT count(*) FROM {m._meta.db_table})" for m in LEDGER)
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    return {m.__name__: n for m, n in zip(LEDGER, row, strict=True)}


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


class Api:
    """Requests to /api/v1 through Django's test client, as one runtime."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.http = DjangoClient()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | str | None = None,
        token: Any = ...,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        token = self.token if token is ... else token
        extra = dict(headers or {})
        if token is not None:
            extra["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        response = self.http.generic(
            method, "/api/v1" + path, data=data, content_type="application/json", headers=extra
        )
        try:
            parsed = json.loads(response.content)
        except ValueError:
            parsed = None
        return Answer(response.status_code, parsed, response.headers)

    def post(self, path: str, body: Any = None, **kw: Any) -> Answer:
        return self.call("POST", path, body if body is not None else {}, **kw)

    def get(self, path: str, **kw: Any) -> Answer:
        return self.call("GET", path, **kw)


@pytest.fixture
def runtime_token(transactional_db):  # type: ignore[no-untyped-def]
    """A runtime for tests that serve the API from a live server (their data must be committed)."""
    return runtime_create(name="watching-agent", actor="test")


@pytest.fixture
def runtime(db):  # type: ignore[no-untyped-def]
    return runtime_create(name="invoices-agent", actor="test")


@pytest.fixture
def other_runtime(db):  # type: ignore[no-untyped-def]
    return runtime_create(name="other-agent", actor="test")


@pytest.fixture
def api(runtime) -> Api:  # type: ignore[no-untyped-def]
    return Api(runtime[1])


@pytest.fixture
def other_api(other_runtime) -> Api:  # type: ignore[no-untyped-def]
    return Api(other_runtime[1])
