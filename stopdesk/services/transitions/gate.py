"""The per-task gate between starts and Stop (PostgreSQL): a transaction-level advisory lock on
(GATE_CLASS, the task's key). Starts hold it shared, so the starts of one task overlap; Stop takes
it exclusive before it reads the clock, so it waits only for the starts already holding it. The
lock manager queues a request behind a waiting one whose mode it conflicts with, so new starts
line up behind a waiting Stop and a burst of them cannot starve it (row locks give no such
promise). The boundary takes it through `stopdesk_gate(task_id)` (migration 0016), a volatile
function that then reads the task's stop with a fresh snapshot: a start that waited for Stop
sees the stop that Stop just committed, though its own statement began before.

Lock order: the gate before any task row lock, everywhere, or a start holding the row and
waiting for the gate behind Stop deadlocks with Stop waiting for the row.

SQLite takes its write lock at BEGIN (transaction_mode IMMEDIATE), so writers are serialised
there and no gate is needed."""

from __future__ import annotations

from django.db import connection

from stopdesk.services.sql import is_postgres

# The first key of the two-int advisory lock form: "STOP" in ASCII. The two-int keys are a space of
# their own, apart from the one-bigint keys used elsewhere (the audit sealer, registration keys).
GATE_CLASS = 0x53544F50


def gate_key(task_id: int) -> int:
    """The second key: the task id mod 2**32, as a signed int. Two tasks sharing a key only wait
    for each other now and then. `stopdesk_gate` computes the same in SQL."""
    return task_id % 2**32 - 2**31


def task_gate_shared(task_id: int) -> None:
    """Hold the gate as a start does, until the transaction ends (call it inside one)."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [GATE_CLASS, gate_key(task_id)])


def task_gate_exclusive(task_id: int) -> None:
    """Hold the gate as Stop does, until the transaction ends: waits for the starts holding it
    and keeps new ones out."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [GATE_CLASS, gate_key(task_id)])
