"""Stop fan-out: a stop over 2,000 running OpenAI background responses, until every item is settled.

The stand-in runs in its own process (its own GIL) at 50 ms per call. One canceller, in this
process, takes every dispatched item with the OpenAI mechanism's configured concurrency, as the
batched job `reconcile.cancel_items` does: claim, record the attempts, send each cancel and read
it back (that many calls in flight), record the answers and the transitions set-based. The clock
runs from the stop request to the last item settled, and every item is checked to be settled.

    fanout.floor_s    = measured in the same run: the same number of cancel + read-back calls
                        against the same stand-in, with the same concurrency, from a bare httpx
                        client (no database, no SDK)
    fanout.settle_s   = stop request -> every item settled
    fanout.ratio      = settle / floor (target <= 1.3)
    fanout.scale_out  = settle time with one canceller process over the time with two, each
                        taking half of the same stop's items (target >= 1.7); both times run from
                        the stop request (the fan-out's own statement is in them) to every item
                        settled
    fanout.floor_scale_out = the floor's own scale-out: its calls split the same way over two bare
                        client processes. The stand-in, PostgreSQL and the cancellers share the
                        machine's cores, so this is what two processes can gain here at all; read
                        fanout.scale_out against it
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import Figure

ITEMS = int(os.environ.get("BENCH_FANOUT_ITEMS", "2000"))
LATENCY_S = 0.05

_SERVER = """
import sys
from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from stopdrill.sandbox.server import BackgroundServer
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
        floor_s = _measured_floor(url, concurrency)
        ids = _start_items(url, concurrency)
        settle_s = _stop_and_settle(ids, concurrency)
        one_s = _settle_in_processes(_start_items(url, concurrency), concurrency, processes=1)
        two_s = _settle_in_processes(_start_items(url, concurrency), concurrency, processes=2)
        floor_two_s = _measured_floor(url, concurrency, processes=2)
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=10)
        connection.close()
    return [
        Figure("fanout.settle_s", settle_s, "s"),
        Figure("fanout.floor_s", floor_s, "s"),
        Figure("fanout.floor_computed_s", ITEMS / concurrency * (2 * LATENCY_S), "s"),
        Figure("fanout.ratio", settle_s / floor_s, "x", target=1.3),
        Figure("fanout.concurrency", concurrency, "calls in flight"),
        Figure("fanout.one_process_s", one_s, "s"),
        Figure("fanout.two_processes_s", two_s, "s"),
        Figure("fanout.scale_out", one_s / two_s, "x", target=1.7, higher_is_better=True),
        Figure("fanout.floor_two_processes_s", floor_two_s, "s"),
        Figure("fanout.floor_scale_out", floor_s / floor_two_s, "x"),
    ]


def _measured_floor(url: str, concurrency: int, *, processes: int = 1) -> float:
    """ITEMS background responses created untimed, then cancelled and read back with
    `concurrency` calls in flight per process from a bare client in each of `processes` processes:
    what the fan-out cannot beat on this machine, with this stand-in."""
    import multiprocessing

    with _bare_client(url, concurrency) as client, ThreadPoolExecutor(max_workers=concurrency) as pool:
        response_ids = list(pool.map(lambda _: _bare_create(client), range(ITEMS)))
    if processes == 1:
        started = time.perf_counter()
        _bare_cancel_part(url, response_ids, concurrency)
        return time.perf_counter() - started
    from django.db import connections

    connections.close_all()  # a forked child must not share this process's database connection
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_bare_cancel_part, args=(url, response_ids[i::processes], concurrency))
        for i in range(processes)
    ]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    floor_s = time.perf_counter() - started
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError("a floor process failed")
    return floor_s


def _bare_client(url: str, concurrency: int) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.Client(base_url=url, limits=limits, headers={"Authorization": "Bearer bench"}, timeout=30)


def _bare_create(client: Any) -> str:
    answer = client.post("/responses", json={"model": "bench", "input": "x", "background": True})
    answer.raise_for_status()
    return str(answer.json()["id"])


def _bare_cancel_part(url: str, response_ids: list[str], concurrency: int) -> None:
    with _bare_client(url, concurrency) as client:

        def cancel_and_read(response_id: str) -> str:
            client.post(f"/responses/{response_id}/cancel").raise_for_status()
            answer = client.get(f"/responses/{response_id}")
            answer.raise_for_status()
            return str(answer.json()["status"])

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            statuses = set(pool.map(cancel_and_read, response_ids))
    if statuses != {"cancelled"}:
        raise RuntimeError(f"the floor's cancels did not all land: {statuses}")


def _cancel_part(item_ids: list[int], concurrency: int) -> None:
    from django.db import connections

    from reconcile.services.cancel import items_cancel

    try:
        items_cancel(item_ids=item_ids, mechanism="openai", concurrency=concurrency)
    finally:
        connections.close_all()


def _settle_in_processes(ids: list[int], concurrency: int, *, processes: int) -> float:
    """One stop, its dispatched items split across `processes` canceller processes (as two
    Celery worker machines would share them)."""
    import multiprocessing

    from django.db import connections

    from stopdesk.models import WorkItem
    from stopdesk.services.stop import task_request_stop
    from stopdesk.states import SETTLED

    task_id = WorkItem.objects.get(pk=ids[0]).task_id
    dispatched: list[int] = []
    started = time.perf_counter()
    task_request_stop(task_id=task_id, actor="bench", dispatch=dispatched.extend)
    connections.close_all()  # a forked child opens its own connection
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_cancel_part, args=(dispatched[i::processes], concurrency)) for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    settle_s = time.perf_counter() - started
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError("a canceller process failed")
    unsettled = WorkItem.objects.filter(pk__in=ids).exclude(state__in=SETTLED).count()
    if unsettled:
        raise RuntimeError(f"{unsettled} item(s) not settled with {processes} process(es)")
    return settle_s


def _start_items(url: str, concurrency: int) -> list[int]:
    from django.db import connection

    from reconcile.mechanisms.openai.agent import response_create
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
