"""/healthz answers for the database and the broker: JSON, 200 when both answer, 503 otherwise."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def test_healthz_is_200_with_both_checks_when_database_and_broker_answer() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    assert "no-cache" in response["Cache-Control"]


@override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0")
def test_healthz_is_503_naming_the_broker_when_it_does_not_answer() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["checks"]["database"]["ok"]
    assert not body["checks"]["broker"]["ok"]
    assert "cannot reach the Celery broker at redis://127.0.0.1:1/0" in body["checks"]["broker"]["error"]


def test_healthz_needs_no_login() -> None:
    assert Client().get("/healthz", follow=False).status_code in (200, 503)
