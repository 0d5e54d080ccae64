"""Stop fan-out: a stop over 2,000 running OpenAI background responses, until every item is settled.

The stand-in runs in its own process (its own GIL) at 50 ms per call. The canceller runs with the
OpenAI mechanism's configured concurrency, spread over a few forked processes: each item is
claimed, its cancel sent, read back with retrieve, and the result recorded (attempt, result and
transition each in their own transaction). The clock runs from the stop request to the last item
settled, and every item is checked to be settled.

    fanout.floor_s  = (items / concurrency) x (cancel + read-back latency)
    fanout.settle_s = stop request -> every item settled
    fanout.ratio    = settle / floor (target <= 1.5)
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from bench.harness import Figure

ITEMS = int(os.environ.get("BENCH_FANOUT_ITEMS", "2000"))
LATENCY_S = 0.05
# The canceller's concurrency (the OpenAI mechanism's `concurrency`) is spread over this many
# processes, as Celery would spread cancel jobs over worker processes: one CPython process cannot
# drive 32 threads of SDK and ORM work without the GIL becoming the bottleneck.
PROCESSES = int(os.environ.get("BENCH_FANOUT_PROCESSES", str(min(4, max(1, (os.cpu_count() or 2) - 2)))))

# The stand-in served by uvicorn on a socket made with IPPROTO_TCP: asyncio sets TCP_NODELAY only
# on sockets whose proto says TCP, and without it every response (headers and body are two writes)
# waits ~40 ms for the client's delayed ACK, which would double the configured 50 ms.
_SERVER = """
import socket, sys, threading
import uvicorn
from reconcile.sandbox.openai_standin import OpenAIStandin
party = OpenAIStandin(latency_s=float(sys.argv[1]), queue_s=0.0, run_s=3600.0)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
server = uvicorn.Server(uvicorn.Config(party.app(), log_level="warning", access_log=False, http="h11", backlog=4096))
thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
thread.start()
while not server.started:
    threading.Event().wait(0.01)
print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
sys.stdin.read()
server.should_exit = True
thread.join(5)
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
        Figure("fanout.processes", min(PROCESSES, concurrency), "processes"),
    ]


def _start_items(url: str, concurrency: int) -> list[int]:
    from django.db import connection

    from reconcile.mechanisms.openai import response_create
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


def _cancel_chunk(item_ids: list[int], threads: int) -> int:
    from django.db import connection

    from reconcile.services.cancel import items_cancel

    try:
        return len(items_cancel(item_ids=item_ids, mechanism="openai", concurrency=threads))
    finally:
        connection.close()


def _warm(_: int) -> int:
    return os.getpid()


def _stop_and_settle(ids: list[int], concurrency: int) -> float:
    from django.db import connections

    from stopdesk.models import WorkItem
    from stopdesk.services.stop import task_request_stop
    from stopdesk.states import SETTLED

    task_id = WorkItem.objects.get(pk=ids[0]).task_id
    processes = min(PROCESSES, concurrency)
    threads = concurrency // processes
    connections.close_all()  # forked children open their own
    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("fork")) as pool:
        # Canceller processes are up before the clock starts, as Celery workers would be.
        assert len(set(pool.map(_warm, range(processes * 4)))) >= 1
        dispatched: list[int] = []
        started = time.perf_counter()
        task_request_stop(task_id=task_id, actor="bench", dispatch=dispatched.extend)
        chunks = [dispatched[n::processes] for n in range(processes)]
        list(pool.map(_cancel_chunk, chunks, [threads] * processes))
        settle_s = time.perf_counter() - started
    unsettled = WorkItem.objects.filter(pk__in=ids).exclude(state__in=SETTLED).count()
    if unsettled or len(dispatched) != len(ids):
        raise RuntimeError(f"{unsettled} item(s) not settled; {len(dispatched)} of {len(ids)} dispatched")
    return settle_s
