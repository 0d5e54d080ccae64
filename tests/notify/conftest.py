"""The sandbox webhook receiver as a real server on loopback, and an endpoint row pointing at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stopdrill.sandbox.server import BackgroundServer
from stopdrill.sandbox.webhooks import WebhookReceiver
from tests.workers.conftest import broker, start_worker  # noqa: F401  (real worker processes)


@pytest.fixture(scope="session")
def receiver_server() -> Iterator[tuple[WebhookReceiver, BackgroundServer]]:
    party = WebhookReceiver()
    with BackgroundServer(party.app, name="webhooks", graceful_shutdown_s=0.2) as server:
        yield party, server


@pytest.fixture
def receiver(receiver_server):  # type: ignore[no-untyped-def]
    party, _ = receiver_server
    party.reset()
    return party


@pytest.fixture
def endpoint(receiver_server, db):  # type: ignore[no-untyped-def]
    """An endpoint that asked for one message per item: what the delivery tests follow."""
    from stopdesk.notify.models import WebhookEndpoint

    party, server = receiver_server
    return WebhookEndpoint.objects.create(name="ops", url=server.url + "/hooks", secret=party.secret, per_item=True)


@pytest.fixture
def digest_endpoint(receiver_server, db):  # type: ignore[no-untyped-def]
    """An endpoint as it is created by default: per-item alerts reach it as digests."""
    from stopdesk.notify.models import WebhookEndpoint

    party, server = receiver_server
    return WebhookEndpoint.objects.create(name="team", url=server.url + "/hooks", secret=party.secret)


@pytest.fixture(autouse=True)
def _quick_retries(settings) -> None:  # type: ignore[no-untyped-def]
    settings.STOPDESK_NOTIFY = {
        **settings.STOPDESK_NOTIFY,
        "RETRY_BASE_SECONDS": 0.2,
        "MAX_ATTEMPTS": 3,
        "TIMEOUT_SECONDS": 3.0,
        "CLAIM_SECONDS": 2.0,
    }
