"""Checking the audit trail's hash chains: every sealed event is recomputed from its columns and
the previous link, and each chain's head must be its last event. Events not sealed yet (committed
after the last seal) are counted apart: they are not broken, they are waiting for the sealer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from stopdesk.audit_db import SQLITE_COLUMNS, postgres_columns
from stopdesk.audit_offline import Break, Head, anchor_break, check_chain
from stopdesk.audit_sign import Anchored
from stopdesk.services.audit_seal import audit_seal, audit_unsealed
from stopdesk.services.sql import read_snapshot


@dataclass
class Report:
    events: int = 0
    chains: int = 0
    breaks: list[Break] | None = None
    sealed_now: int = 0
    unsealed: int = 0
    oldest_unsealed: datetime | None = None
    anchored_chains: int = 0


def chain_events(task_ids: list[int]) -> Iterator[tuple]:  # type: ignore[type-arg]
    columns = postgres_columns() if connection.vendor == "postgresql" else list(SQLITE_COLUMNS)
    # Chain 0 holds the events without a task; the others are found through the (task, at) index.
    tasks = [key for key in task_ids if key != 0]
    where = [f"task_id IN ({', '.join(['%s'] * len(tasks))})"] if tasks else []
    if 0 in task_ids:
        where.append("task_id IS NULL")
    # Qualified: `seq` alone would name the text column of the select list.
    sql = (
        f"SELECT coalesce(task_id, 0), id, hash, {', '.join(columns)} FROM stopdesk_event e"
        f" WHERE ({' OR '.join(where)}) AND e.seq <> 0"
        " ORDER BY coalesce(e.task_id, 0), e.seq, e.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, tasks)
        yield from cursor.fetchall()


def audit_verify(
    *, task_id: int | None = None, batch: int = 500, seal: bool = True, anchored: Anchored | None = None
) -> Report:
    """Seal what has committed (unless `seal` is False), then walk the chains (one task's, or all
    in task order, `batch` chains per query) and report the first broken link of each, and the
    events still unsealed. With `anchored` (the heads signed outside the database), each chain
    must also still hold the newest head signed for it."""
    report = Report(breaks=[])
    assert report.breaks is not None
    if seal:
        report.sealed_now = audit_seal(wait=True) or 0
    # One snapshot for heads and events, so a sealer moving a head meanwhile is not taken for a
    # broken link. No transaction on SQLite: this database's transactions take the write lock.
    with read_snapshot(sqlite_transaction=False):
        _walk(report, task_id, batch, anchored)
    unsealed = audit_unsealed()
    report.unsealed, report.oldest_unsealed = unsealed.events, unsealed.oldest
    return report


def _walk(report: Report, task_id: int | None, batch: int, anchored: Anchored | None) -> None:
    assert report.breaks is not None
    after = -1
    while True:
        with connection.cursor() as cursor:
            if task_id is not None:
                cursor.execute(
                    "SELECT task_id, seq, hash, anchor_seq, anchor_hash FROM stopdesk_eventchain WHERE task_id = %s",
                    [task_id],
                )
            else:
                cursor.execute(
                    "SELECT task_id, seq, hash, anchor_seq, anchor_hash FROM stopdesk_eventchain"
                    " WHERE task_id > %s ORDER BY task_id LIMIT %s",
                    [after, batch],
                )
            heads = {row[0]: row[1:] for row in cursor.fetchall()}
        if not heads:
            break
        by_task: dict[int, list[tuple]] = {key: [] for key in heads}  # type: ignore[type-arg]
        for row in chain_events(list(heads)):
            by_task[row[0]].append(row)
        for key, values in heads.items():
            report.chains += 1
            report.events += len(by_task[key])
            report.breaks.extend(_check(Head(key, *values), by_task[key], anchored, report))
        if task_id is not None:
            break
        after = max(heads)
    if task_id is None:
        report.breaks.extend(_unchained())
        if anchored is not None:
            report.breaks.extend(_chains_gone(anchored, report))


def _check(head: Head, rows: list[tuple], anchored: Anchored | None, report: Report) -> list[Break]:  # type: ignore[type-arg]
    signed = anchored.heads.get(head.task_id) if anchored is not None else None
    events = ((event_id, stored, int(seq), columns) for _, event_id, stored, seq, *columns in rows)
    found, hash_at = check_chain(head, events, hash_at=signed[0] if signed else -1)
    breaks = [found] if found is not None else []
    if signed is not None:
        report.anchored_chains += 1
        if (late := anchor_break(head, signed, hash_at, head.task_id)) is not None:
            breaks.append(late)
    return breaks


def _chains_gone(anchored: Anchored, report: Report) -> list[Break]:
    """Chains signed outside the database that the database no longer has."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT task_id FROM stopdesk_eventchain")
        present = {row[0] for row in cursor.fetchall()}
    gone = sorted(set(anchored.heads) - present)
    report.anchored_chains += len(gone)
    return [b for key in gone if (b := anchor_break(None, anchored.heads[key], None, key)) is not None]


def _unchained() -> list[Break]:
    """Sealed events no chain knows about (a head removed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(e.task_id, 0), min(e.id), min(e.seq) FROM stopdesk_event e"
            " LEFT JOIN stopdesk_eventchain c ON c.task_id = coalesce(e.task_id, 0)"
            " WHERE c.task_id IS NULL AND e.seq <> 0 GROUP BY coalesce(e.task_id, 0) ORDER BY 1 LIMIT 100"
        )
        return [Break(key, seq, event_id, "no chain head for this task's events") for key, event_id, seq in cursor]
