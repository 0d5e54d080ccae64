"""Real frameworks against the scripted model on loopback, recording through the in-process runtime
into PostgreSQL (threads, so the test database is transactional)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from reconcile.mechanisms import registry
from reconcile.mechanisms.http.sandbox import CRM
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdesk.agent.runtime import LocalRuntime
from stopdrill.sandbox.server import BackgroundServer


@pytest.fixture(scope="module")
def _model_served() -> Iterator[tuple[OpenAIStandin, BackgroundServer]]:
    party = OpenAIStandin()
    with BackgroundServer(party.app, name="openai") as server:
        yield party, server


@pytest.fixture
def model(_model_served: tuple[OpenAIStandin, BackgroundServer]) -> Iterator[tuple[OpenAIStandin, str]]:
    party, server = _model_served
    yield party, server.url + "/v1"
    party.reset()


@pytest.fixture
def crm(settings) -> Iterator[tuple[CRM, str]]:  # type: ignore[no-untyped-def]
    """A sandbox CRM of the test's own, configured as the HTTP adapter's "crm" system (the only
    way the server learns where a system is)."""
    party = CRM()
    with BackgroundServer(party.app, name="crm") as server:
        mechanisms = copy.deepcopy(settings.STOPDESK_MECHANISMS)
        mechanisms["http"]["options"]["systems"]["crm"]["base_url"] = server.url
        settings.STOPDESK_MECHANISMS = mechanisms
        yield party, server.url


@pytest.fixture
def runtime(transactional_db) -> LocalRuntime:  # type: ignore[no-untyped-def]
    registry.reset()
    # Stop's cancellation jobs are run by the test itself (the reconcile service), not by Celery.
    return LocalRuntime(actor="agent:test", dispatch=lambda ids: None)
