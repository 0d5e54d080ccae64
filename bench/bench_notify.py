"""Notification latency.

notify.latency_ms   from the commit of the event that causes a notification to the webhook
                    receiver's 2xx, p99 (and p50) over 1,000 events, with the default worker
                    (`python -m stopdesk worker`: prefork, concurrency 8) on Redis

Each event is an item becoming uncertain, committed by this process at a steady pace
(STOPDESK_BENCH_NOTIFY_RATE per second, default 20); the sandbox receiver (a real HTTP server)
verifies every signature and notes when it answered. Broker: STOPDESK_BENCH_REDIS_URL.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Figure

ROOT = Path(__file__).resolve().parents[1]
EVENTS = int(os.environ.get("STOPDESK_BENCH_NOTIFY_EVENTS", "1000"))
RATE = float(os.environ.get("STOPDESK_BENCH_NOTIFY_RATE", "20"))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run() -> list[Figure]:
    import redis
    from django.db import connection

    from stopdesk.celery import app
    from stopdesk.models import Task, WorkItem
    from stopdesk.notify.models import Notification, WebhookEndpoint
    from stopdesk.services.transitions import item_transition
    from stopdesk.states import ItemState, Kind
    from stopdrill.sandbox.server import BackgroundServer
    from stopdrill.sandbox.webhooks import WebhookReceiver

    broker = os.environ.get("STOPDESK_BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
    redis.Redis.from_url(broker).flushdb()
    app.conf.broker_url = broker
    app.conf.task_always_eager = False
    receiver = WebhookReceiver()
    server = BackgroundServer(receiver.app, name="webhooks").start()
    # One message per event is what this measures: the endpoint asks for per-item alerts.
    WebhookEndpoint.objects.create(name="bench", url=server.url + "/hooks", secret=receiver.secret, per_item=True)
    task = Task.objects.create(title="bench notify")
    items = WorkItem.objects.bulk_create(
        [
            WorkItem(task=task, kind=Kind.EXTERNAL_OPERATION, noun="export", state=ItemState.RUNNING)
            for _ in range(EVENTS)
        ]
    )
    db = connection.settings_dict
    env = {
        **os.environ,
        "CELERY_BROKER_URL": broker,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "PYTHONPATH": str(ROOT),
        "STOPDESK_NOTIFY_EMAIL": "0",
    }
    log = Path(tempfile.mkdtemp(prefix="stopdesk-bench-notify-")) / "worker.log"
    print(f"# worker log: {log}", flush=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stopdesk", "worker", "--pool=prefork", "--concurrency", "8",
         "-n", "notify@bench", "--without-mingle", "--without-gossip", "-l", os.environ.get("STOPDESK_BENCH_NOTIFY_LOG", "warning")],
        cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    committed: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=["notify@bench"], timeout=1.0):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-2000:]}")
        started = time.monotonic()
        for n, item in enumerate(items):
            # The pace: event n is committed at started + n / RATE.
            time.sleep(max(0.0, started + n / RATE - time.monotonic()))
            item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor="bench")  # commits
            committed[item.pk] = time.time()
        deadline = time.monotonic() + 120
        while len(receiver.deliveries()) < EVENTS and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=60)
        server.stop()
    by_message = dict(Notification.objects.values_list("id", "item_id"))
    latencies = []
    for got in receiver.deliveries():
        item_id = by_message[int(got["webhook_id"].rsplit("_", 1)[1])]
        latencies.append((got["received_at"] - committed[item_id]) * 1000)
    delivered = len(latencies)
    from stopdesk.notify.models import DeliveryAttempt

    http_ms = list(DeliveryAttempt.objects.values_list("ms", flat=True))
    return [
        Figure("notify.latency_ms_p99", _percentile(latencies, 0.99) if latencies else float("inf"), "ms", target=1000),
        Figure("notify.latency_ms_p50", statistics.median(latencies) if latencies else float("inf"), "ms"),
        Figure(
            "notify.delivered", delivered, f"of {EVENTS} (verified, each once)", target=EVENTS, higher_is_better=True
        ),
        Figure("notify.http_ms_p50", statistics.median(http_ms) if http_ms else 0.0, "ms (the POST alone)"),
        Figure("notify.duplicates", receiver.duplicates, "re-sends seen by the receiver"),
    ]
