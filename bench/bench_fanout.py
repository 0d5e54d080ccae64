"""Stop fan-out: a stop over 2,000 running OpenAI background responses, until every item is settled.

The stand-in runs in its own process (its own GIL) at 50 ms per call. One canceller, in this
process, takes every dispatched item with the OpenAI mechanism's configured concurrency, as the
batched job `reconcile.cancel_items` does: claim, record the attempts, send each cancel and read
it back (that many calls in flight), record the answers and the transitions set-based. The clock
runs from the stop request to the last item settled, and every item is checked to be settled.

    fanout.floor_s  = (items / concurrency) x (cancel + read-back latency)
    fanout.settle_s = stop request -> every item settled
    fanout.ratio    = settle / floor (target <= 1.5)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench.harness import Figure

ITEMS = int(os.environ.get("BENCH_FANOUT_ITEMS", "2000"))
LATENCY_S = 0.05

_SERVER = """
import sys
from reconcile.sandbox.openai_standin import OpenAIStandin
from reconcile.sandbox.server import BackgroundServer
party = OpenAIStandin(latency_s=float(sys.argv[1]), queue_s=0.0, run_s=3600.0)
with BackgroundServer(party.app, name="openai") as server:
    print(server.url + "/v1", flush=True)
    sys.stdin.read()
"""


def run() -> list[Figure]:
    from django.db import connection

    from reconcile.mechanisms.registry import mechanism_settings

    concurrency = mechanism_settings("openai").concurrency
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(LATENCY_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        ids = _start_items(url, concurrency)
        settle_s = _stop_and_settle(ids, concurrency)
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=10)
        connection.close()
    floor_s = ITEMS / concurrency * (2 * LATENCY_S)
    return [
        Figure("fanout.settle_s", settle_s, "s", target=1.5 * floor_s),
        Figure("fanout.floor_s", floor_s, "s"),
        Figure("fanout.ratio", settle_s / floor_s, "x", target=1.5),
        Figure("fanout.concurrency", concurrency, "calls in flight"),
    ]


def _start_items(url: str, concurrency: int) -> list[int]:
    from django.db import connection

    from stopdesk.agent.openai import response_create
    from stopdesk.services.items import item_register, task_create
    from stopdesk.states import Kind

    task = task_create(title="Fan-out benchmark", actor="bench")
    ids = [
        item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="bench", mechanism="openai").pk
        for _ in range(ITEMS)
    ]

    def start(item_id: int) -> None:
        try:
            response_create(item_id=item_id, actor="bench", base_url=url, model="bench", input="x")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(start, ids))
    return ids


def _stop_and_settle(ids: list[int], concurrency: int) -> float:
    from reconcile.services.cancel import items_cancel
    from stopdesk.models import WorkItem
    from stopdesk.services.stop import task_request_stop
    from stopdesk.states import SETTLED

    task_id = WorkItem.objects.get(pk=ids[0]).task_id
    dispatched: list[int] = []
    started = time.perf_counter()
    task_request_stop(task_id=task_id, actor="bench", dispatch=dispatched.extend)
    items_cancel(item_ids=dispatched, mechanism="openai", concurrency=concurrency)
    settle_s = time.perf_counter() - started
    unsettled = WorkItem.objects.filter(pk__in=ids).exclude(state__in=SETTLED).count()
    if unsettled or len(dispatched) != len(ids):
        raise RuntimeError(f"{unsettled} item(s) not settled; {len(dispatched)} of {len(ids)} dispatched")
    return settle_s
