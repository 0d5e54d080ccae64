"""/readyz and `python -m stopdesk ready`: a worker and beat are alive when their heartbeat rows
are recent; /metrics answers only its bearer token, with a constant number of queries."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stopdesk.models import Event
from stopdesk.notify.heartbeat import heartbeat_record
from stopdesk.notify.selectors import audit_backlog
from stopdesk.notify.tally import metrics_tally
from stopdesk.services.audit_seal import audit_seal
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import ACTOR, make_item, make_task
from tests.run.helpers import ROOT

pytestmark = pytest.mark.django_db


def test_readyz_is_503_until_worker_and_beat_have_shown_life_then_200_with_ages() -> None:
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["worker"] == {"ok": False, "age_s": None}
    heartbeat_record("worker")
    heartbeat_record("beat", now=timezone.now() - timedelta(seconds=30))
    body = Client().get("/readyz").json()
    assert body["status"] == "ready" and body["checks"]["beat"]["ok"] and 29 <= body["checks"]["beat"]["age_s"] < 60


def test_readyz_names_a_stale_beat_and_checks_one_component_on_request() -> None:
    heartbeat_record("worker")
    heartbeat_record("beat", now=timezone.now() - timedelta(minutes=10))
    response = Client().get("/readyz")
    assert response.status_code == 503 and not response.json()["checks"]["beat"]["ok"]
    assert Client().get("/readyz?component=worker").status_code == 200
    bad = Client().get("/readyz?component=web")
    assert bad.status_code == 400 and bad.json()["field"] == "component"


@pytest.mark.postgres
def test_the_ready_command_exits_by_the_heartbeat_age(transactional_db, pg_dsn) -> None:
    env = {"DATABASE_URL": pg_dsn, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "stopdesk", "ready", "worker"]
    down = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "NOT ready" in down.stdout
    heartbeat_record("worker")
    up = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0 and "ready" in up.stdout, up.stderr


def test_metrics_are_off_without_a_token_and_need_the_bearer_token(settings) -> None:
    settings.STOPDESK_METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    settings.STOPDESK_METRICS_TOKEN = "s3cret-token"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    response = Client().get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")


def _scrape(settings) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    settings.STOPDESK_METRICS_TOKEN = "t"
    with CaptureQueriesContext(connection) as queries:
        response = Client().get("/metrics", headers={"Authorization": "Bearer t"})
    assert response.status_code == 200
    return response.content.decode(), len(queries)


def _metric(text: str, line_start: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(line_start + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_metrics_show_the_ledger_with_the_same_number_of_queries_whatever_its_size(settings) -> None:
    task = make_task()
    item = make_item(task, state=ItemState.RUNNING, mechanism="openai")
    item_transition(
        item_id=item.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR, investigate_by=timezone.now() - timedelta(hours=1)
    )
    metrics_tally()
    text, small = _scrape(settings)
    assert _metric(text, "stopdesk_uncertain_items") == 1
    assert _metric(text, "stopdesk_uncertain_past_investigate_by") == 1
    assert _metric(text, "stopdesk_review_queue_length") == 1
    assert _metric(text, 'stopdesk_items{mechanism="openai",state="uncertain"}') == 1
    assert _metric(text, 'stopdesk_heartbeat_age_seconds{name="worker"}') == -1  # never
    assert "stopdesk_stop_settle_seconds_bucket" in text and "stopdesk_boundary_refusals_total" in text
    for _ in range(30):
        make_item(task, state=ItemState.COMPLETED, mechanism="celery")
    metrics_tally()
    text, large = _scrape(settings)
    assert _metric(text, 'stopdesk_items{mechanism="celery",state="completed"}') == 30
    assert large == small


def test_metrics_show_the_audit_events_the_sealer_has_not_sealed_yet(settings) -> None:
    audit_seal()
    _, before = _scrape(settings)
    task = make_task()
    make_item(task, state=ItemState.RUNNING, mechanism="openai")
    unsealed = Event.objects.filter(seq=0)
    written = unsealed.count()
    assert written > 0
    oldest = unsealed.order_by("id").values_list("at", flat=True).first()
    assert oldest is not None
    text, queries = _scrape(settings)
    assert _metric(text, "stopdesk_audit_unsealed_events") == written
    age = _metric(text, "stopdesk_audit_unsealed_oldest_age_seconds")
    assert 0 < age <= (timezone.now() - oldest).total_seconds()
    assert queries == before  # the same statements, whatever the backlog

    audit_seal()
    text, _ = _scrape(settings)
    assert _metric(text, "stopdesk_audit_unsealed_events") == 0
    assert _metric(text, "stopdesk_audit_unsealed_oldest_age_seconds") == 0


def test_the_unsealed_count_stops_at_its_cap() -> None:
    task = make_task()
    for _ in range(3):
        make_item(task, state=ItemState.RUNNING, mechanism="openai")
    assert Event.objects.filter(seq=0).count() > 2
    assert audit_backlog(cap=2).unsealed == 2
    assert audit_backlog().unsealed == Event.objects.filter(seq=0).count()
