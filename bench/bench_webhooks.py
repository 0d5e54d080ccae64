"""What OpenAI's webhooks save after a Stop: read-backs, and the wait for the provider's final state.

One run, two arms over the same scenario, against the OpenAI stand-in over HTTP and stopdesk's web
door on loopback (uvicorn): DRAFTS background responses are stopped; half ignore the cancel and
complete at the end of their run, half are cancelled and flip to completed a moment later. The
reconcile sweep runs every SWEEP_S (its schedule decides when an item is read; the sweep only
finds what is due).

webhooks.polling_readbacks_per_draft   GETs of each response until stopdesk recorded its final
                                       state (the cancel's read-back included), polling alone
webhooks.polling_lag_p50_ms, _p95_ms    the provider's final state to stopdesk's record, polling alone
webhooks.readbacks_per_draft           the same with the stand-in's signed webhooks sent to
                                       /hooks/openai (some twice, in no order) and the fallback
                                       polling OPENAI_WEBHOOK_SECRET sets (target: at most 2)
webhooks.lag_p50_ms, lag_p95_ms        the same wait with webhooks (target for p95: at most 1 s; the
                                       stand-in delays each send by up to 0.3 s, as deliveries vary)

`BENCH=webhooks python -m bench`. The door runs a webhook's read-back in its request (Celery
eager here): in production it is a `reconcile.wake_item` job, one queue hop later.
"""

from __future__ import annotations

import base64
import copy
import statistics
import time
from typing import Any, cast

from bench.harness import Figure

DRAFTS = 20
RUN_S = 2.0  # a draft that ignores its cancel completes this long after its create
FLIP_S = 1.5  # a cancelled draft turns completed this long after its cancel
SWEEP_S = 0.25
SECRET = "whsec_" + base64.b64encode(b"stopdesk-bench-webhook-secret-32").decode()


def _arm(*, webhooks: bool, door_url: str, party: Any, base_url: str) -> tuple[float, float, float]:
    """Read-backs per settled draft, and the p50 and p95 lag in ms, for one arm."""
    from django.conf import settings

    from reconcile.mechanisms import registry
    from reconcile.mechanisms.openai import sandbox as faults
    from reconcile.mechanisms.openai.agent import response_create
    from reconcile.services.cancel import items_cancel
    from reconcile.services.reconcile import sweep_once
    from stopdesk.models import Event, WorkItem
    from stopdesk.services.items import item_register, task_create
    from stopdesk.services.stop import task_request_stop
    from stopdesk.states import ItemState, Kind

    openai = copy.deepcopy(settings.STOPDESK_MECHANISMS.get("openai", {}))
    openai["options"] = {**openai.get("options", {}), "base_url": base_url, "api_key": "sk-bench"}
    for name in ("recheck_interval_s", "watch_first_s"):
        openai.pop(name, None)
    if webhooks:  # what OPENAI_WEBHOOK_SECRET sets (stopdesk/settings.py)
        openai.update(recheck_interval_s=30.0, watch_first_s=60.0)
    settings.STOPDESK_MECHANISMS = {**settings.STOPDESK_MECHANISMS, "openai": openai}
    settings.STOPDESK_OPENAI_WEBHOOK_SECRET = SECRET if webhooks else ""
    registry.reset()
    party.reset()
    party.configure(
        run_s=RUN_S,
        flip_after_s=FLIP_S,
        webhook_url=door_url if webhooks else "",
        webhook_secret=SECRET,
        webhook_duplicate_rate=0.2,
        webhook_jitter_s=0.3,
    )

    task = task_create(title=f"webhooks bench ({'webhooks' if webhooks else 'polling'})", actor="bench")
    drafts: list[tuple[int, str]] = []
    for n in range(DRAFTS):
        party.arm(faults.IGNORE_CANCEL if n % 2 else faults.FLIP_TO_COMPLETED)
        item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="bench", mechanism="openai")
        response = response_create(item_id=item.pk, actor="bench", model="gpt-bench", input=f"draft {n}")
        drafts.append((item.pk, response.id))
    stopped: list[int] = []
    task_request_stop(task_id=task.pk, actor="bench", dispatch=stopped.extend)
    items_cancel(item_ids=stopped, mechanism="openai")

    def recorded(item_id: int) -> float | None:
        item = WorkItem.objects.get(pk=item_id)
        if item.state == ItemState.COMPLETED:
            return item.finished_at.timestamp() if item.finished_at else None
        late = Event.objects.filter(item_id=item_id, kind="late_result").order_by("at").first()
        return late.at.timestamp() if late else None

    deadline = time.monotonic() + RUN_S + FLIP_S + 30
    pending = dict(drafts)
    lags, reads = [], []
    while pending and time.monotonic() < deadline:
        sweep_once(concurrency=4)
        for item_id, response_id in list(pending.items()):
            at = recorded(item_id)
            if at is None:
                continue
            ended = party.ended_at(response_id)
            lags.append(max(0.0, at - ended) * 1000)
            reads.append(party.counts.count("retrieve", response_id))
            del pending[item_id]
        time.sleep(SWEEP_S)
    if pending:
        raise RuntimeError(f"{len(pending)} draft(s) not settled in time ({'webhooks' if webhooks else 'polling'})")
    party.configure(webhook_url="")
    time.sleep(0.5)  # late duplicates land before the next arm
    return statistics.mean(reads), statistics.median(lags), statistics.quantiles(lags, n=20)[18]


def run() -> list[Figure]:
    from django.core.asgi import get_asgi_application

    from reconcile.mechanisms.openai.sandbox import OpenAIStandin
    from stopdesk.celery import app
    from stopdrill.sandbox.server import BackgroundServer

    party = OpenAIStandin(queue_s=0.02)
    door = get_asgi_application()
    eager, app.conf.task_always_eager = app.conf.task_always_eager, True
    try:
        with (
            BackgroundServer(party.app, name="openai") as provider,
            BackgroundServer(lambda: cast(Any, door), name="stopdesk") as web,
        ):
            base_url, door_url = provider.url + "/v1", web.url + "/hooks/openai"
            polling_reads, polling_p50, polling_p95 = _arm(
                webhooks=False, door_url=door_url, party=party, base_url=base_url
            )
            reads, p50, p95 = _arm(webhooks=True, door_url=door_url, party=party, base_url=base_url)
    finally:
        app.conf.task_always_eager = eager
    return [
        Figure("webhooks.polling_readbacks_per_draft", polling_reads, "reads"),
        Figure("webhooks.polling_lag_p50_ms", polling_p50, "ms"),
        Figure("webhooks.polling_lag_p95_ms", polling_p95, "ms"),
        Figure("webhooks.readbacks_per_draft", reads, "reads", target=2.0),
        Figure("webhooks.lag_p50_ms", p50, "ms"),
        Figure("webhooks.lag_p95_ms", p95, "ms", target=1000.0),
    ]
