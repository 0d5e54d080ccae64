"""Notification digests (a bad day's alerts, per subscriber).

digest.deliveries_per_subscriber   one Stop whose 150 items become uncertain (one by one, as
                                   reconciliation finds them) and 3 that finish later: messages
                                   each subscriber gets (a webhook endpoint and a reviewer's
                                   email, as created by default), target <= 3
digest.per_item_deliveries         beside it, what a subscriber gets who asks for one message
                                   per item (and what every subscriber got before digests)
digest.sweep_ms                    the sweep pass that writes the first digest over 150 facts

Delivered through the outbox to the sandbox webhook receiver (a real HTTP server on loopback,
which verifies every signature) and to Django's in-memory mailbox. The sweep runs at the times
beat would run it (a moved clock: the window is 60 s).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

from bench.harness import Figure

ITEMS = 150
LATER = 3


def run() -> list[Figure]:
    from django.contrib.auth.models import Group, User
    from django.core import mail
    from django.test.utils import override_settings
    from django.utils import timezone

    from stopdesk.models import Task, WorkItem
    from stopdesk.notify.delivery import notifications_deliver
    from stopdesk.notify.digest import digests_send
    from stopdesk.notify.models import Delivery, Notification, WebhookEndpoint
    from stopdesk.permissions import roles_ensure
    from stopdesk.services.items import item_finish
    from stopdesk.services.stop import task_request_stop
    from stopdesk.services.transitions import item_transition
    from stopdesk.states import DeliveryState, ItemState, Kind
    from stopdrill.sandbox.server import BackgroundServer
    from stopdrill.sandbox.webhooks import WebhookReceiver

    def deliver() -> None:
        waiting = Notification.objects.filter(expanded_at__isnull=True).order_by("id").values_list("id", flat=True)
        notifications_deliver(list(waiting))

    roles_ensure()
    reviewer = User.objects.create_user("bench-reviewer", email="reviewer@bench.test")
    reviewer.groups.add(Group.objects.get(name="reviewers"))
    receiver, pager_receiver = WebhookReceiver(), WebhookReceiver()
    server = BackgroundServer(receiver.app, name="webhooks").start()
    pager_server = BackgroundServer(pager_receiver.app, name="pager").start()
    team = WebhookEndpoint.objects.create(name="team", url=server.url + "/hooks", secret=receiver.secret)
    pager = WebhookEndpoint.objects.create(
        name="pager", url=pager_server.url + "/hooks", secret=pager_receiver.secret, per_item=True
    )
    task = Task.objects.create(title="Refund customers")
    items = WorkItem.objects.bulk_create(
        [
            WorkItem(task=task, kind=Kind.EXTERNAL_OPERATION, noun="refund", mechanism="http", state=ItemState.RUNNING)
            for _ in range(ITEMS + LATER)
        ]
    )
    mailers = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    try:
        with override_settings(MAILERS=mailers, EMAIL_BACKEND=mailers["default"]["BACKEND"]):
            mail.outbox = []
            stopped = timezone.now()
            task_request_stop(task_id=task.pk, actor="bench", dispatch=lambda ids: None)
            for item in items[:ITEMS]:
                item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor="bench")
                deliver()  # as the worker does after each commit
            started = time.perf_counter()
            digests_send(now=stopped + timedelta(seconds=70))  # beat, after the window
            sweep_ms = (time.perf_counter() - started) * 1000
            deliver()
            for item in items[ITEMS:]:
                item_finish(item_id=item.pk, succeeded=True, actor="bench")
            digests_send(now=stopped + timedelta(seconds=80))  # the stop has settled
            deliver()
            emails = Counter(m.to[0] for m in mail.outbox)
    finally:
        server.stop()
        pager_server.stop()
    per_target = Counter(Delivery.objects.filter(state=DeliveryState.DELIVERED).values_list("target", flat=True))
    digest_subscribers = [per_target[f"endpoint:{team.pk}"], per_target[f"user:{reviewer.pk}"]]
    # What arrived agrees with the delivery log, each message once.
    arrived = (len(receiver.deliveries()), emails[reviewer.email], len(pager_receiver.deliveries()))
    logged = (per_target[f"endpoint:{team.pk}"], per_target[f"user:{reviewer.pk}"], per_target[f"endpoint:{pager.pk}"])
    if arrived != logged or receiver.duplicates or pager_receiver.duplicates:
        raise RuntimeError(f"arrived {arrived} but the delivery log says {logged}")
    print(f"# deliveries per target: {dict(per_target)}", flush=True)
    worst = max(digest_subscribers)
    per_item = per_target[f"endpoint:{pager.pk}"]
    return [
        Figure("digest.deliveries_per_subscriber", worst, "messages (webhook and email, worst)", target=3),
        Figure("digest.per_item_deliveries", per_item, f"messages to a per-item subscriber ({ITEMS} items + digests)"),
        Figure("digest.fewer_by", per_item / worst if worst else float("inf"), "x fewer than per item"),
        Figure("digest.sweep_ms", sweep_ms, f"ms (first digest over {ITEMS} facts)"),
    ]
