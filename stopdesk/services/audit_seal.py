"""Sealing the audit trail: each committed event gets its place (`seq`) and `hash` in its task's
chain after the transaction that wrote it has committed.

Writers only insert (seq 0, empty hash), so appends to one task never wait for each other. The
sealer takes unsealed events in id order, a bounded batch per transaction, and appends them to
their tasks' chains. On PostgreSQL it holds a transaction-level advisory lock, so two sealers
never interleave; on SQLite the write lock taken at BEGIN does the same.

Events can commit out of id order (a transaction that took a lower id commits after one with a
higher id). The chain does not depend on ids: it is in the order events were sealed, and the
sealer takes every unsealed event it can see, not "everything after the last sealed id", so an
event that commits late is sealed by the next batch at the end of its chain. Nothing is skipped.

Each batch signs the heads it moved and delivers them outside the database before it commits
(services/audit_anchor.py): a rewrite of the chain, even with every hash recomputed, no longer
matches what was signed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from stopdesk.audit_db import SQLITE_COLUMNS, digest, postgres_columns
from stopdesk.services.audit_anchor import chain_heads_anchor
from stopdesk.services.sql import is_postgres

BATCH = 5000
# pg_advisory_xact_lock's key for "sealing the audit chain" (any constant no other code uses).
SEAL_LOCK = 0x5E41_0A0D17


@dataclass(frozen=True)
class Unsealed:
    events: int
    oldest: datetime | None


def audit_seal(*, batch: int = BATCH, max_batches: int | None = None, wait: bool = False) -> int | None:
    """Seal committed events, `batch` per transaction, until none is left (or `max_batches` ran).
    Returns how many were sealed, or None when another sealer holds the lock and `wait` is False."""
    sealed = 0
    runs = 0
    while max_batches is None or runs < max_batches:
        with transaction.atomic():
            if not _lock(wait=wait):
                return None if runs == 0 else sealed
            done = _seal_batch(batch)
        sealed += done
        runs += 1
        if done < batch:
            break
    return sealed


def audit_seal_lock() -> None:
    """Take the sealers' lock in the caller's transaction, waiting for a sealer at work; held until
    it ends. Take it before any table lock that a sealer's UPDATE would wait for (a sealer takes
    this first, then row locks), or the two wait for each other."""
    assert connection.in_atomic_block
    _lock(wait=True)


def audit_seal_in_transaction() -> int:
    """Seal everything visible now inside the caller's transaction, holding the lock until it
    commits (an archive does this so no sealer moves a chain while it takes anchors)."""
    audit_seal_lock()
    sealed = 0
    while done := _seal_batch(BATCH):
        sealed += done
    return sealed


def audit_unsealed() -> Unsealed:
    """Events not sealed yet: how many, and when the oldest was written."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), min(at) FROM stopdesk_event WHERE seq = 0")
        count, oldest = cursor.fetchone()
    if isinstance(oldest, str):  # SQLite hands raw text back for an aggregate
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=timezone.get_current_timezone())
    return Unsealed(count, oldest)


def _lock(*, wait: bool) -> bool:
    if not is_postgres():
        return True  # SQLite: the transaction's write lock (BEGIN IMMEDIATE) already excludes others
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEAL_LOCK])
            return True
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SEAL_LOCK])
        return bool(cursor.fetchone()[0])


def _seal_batch(batch: int) -> int:
    postgres = is_postgres()
    # The chain's columns but seq (which the sealer is about to give), rendered as verification
    # reads them back.
    columns = postgres_columns()[1:] if postgres else list(SQLITE_COLUMNS[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, at, coalesce(task_id, 0), {', '.join(columns)} FROM stopdesk_event e"
            " WHERE e.seq = 0 ORDER BY e.id LIMIT %s",
            [batch],
        )
        rows = cursor.fetchall()
        if not rows:
            return 0
        keys = sorted({row[2] for row in rows})
        heads = _heads(cursor, keys, postgres)
        seals = []
        for event_id, at, key, *rest in rows:
            seq, prev = heads[key]
            value = digest(prev, seq + 1, *rest)
            heads[key] = (seq + 1, value)
            seals.append((event_id, at, seq + 1, value))
        if postgres:
            cursor.execute(
                """
                UPDATE stopdesk_event e SET seq = s.seq, hash = s.hash
                FROM unnest(%s::bigint[], %s::timestamptz[], %s::bigint[], %s::text[]) AS s(id, at, seq, hash)
                WHERE e.id = s.id AND e.at = s.at
                """,
                [[s[0] for s in seals], [s[1] for s in seals], [s[2] for s in seals], [s[3] for s in seals]],
            )
            cursor.execute(
                """
                UPDATE stopdesk_eventchain c SET seq = h.seq, hash = h.hash
                FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS h(task_id, seq, hash)
                WHERE c.task_id = h.task_id
                """,
                [keys, [heads[k][0] for k in keys], [heads[k][1] for k in keys]],
            )
            if cursor.rowcount != len(keys):
                raise RuntimeError("a chain head vanished while sealing")
        else:
            cursor.executemany(
                "UPDATE stopdesk_event SET seq = %s, hash = %s WHERE id = %s", [(s[2], s[3], s[0]) for s in seals]
            )
            cursor.executemany(
                "UPDATE stopdesk_eventchain SET seq = %s, hash = %s WHERE task_id = %s",
                [(heads[k][0], heads[k][1], k) for k in keys],
            )
    chain_heads_anchor([(k, *heads[k]) for k in keys])
    return len(seals)


def _heads(cursor, keys: list[int], postgres: bool) -> dict[int, tuple[int, str]]:  # type: ignore[no-untyped-def]
    """Each task's chain head, made at its first event."""
    if postgres:
        cursor.execute(
            "INSERT INTO stopdesk_eventchain (task_id, seq, hash, anchor_seq, anchor_hash)"
            " SELECT k, 0, '', 0, '' FROM unnest(%s::bigint[]) AS k ON CONFLICT (task_id) DO NOTHING",
            [keys],
        )
        cursor.execute("SELECT task_id, seq, hash FROM stopdesk_eventchain WHERE task_id = ANY(%s)", [keys])
    else:
        cursor.executemany(
            "INSERT INTO stopdesk_eventchain (task_id, seq, hash, anchor_seq, anchor_hash)"
            " VALUES (%s, 0, '', 0, '') ON CONFLICT (task_id) DO NOTHING",
            [(k,) for k in keys],
        )
        cursor.execute(
            f"SELECT task_id, seq, hash FROM stopdesk_eventchain WHERE task_id IN ({', '.join(['%s'] * len(keys))})",
            keys,
        )
    return {task_id: (seq, value) for task_id, seq, value in cursor.fetchall()}
