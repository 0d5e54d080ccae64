"""A claim held by a lease: short, and renewed while its holder works.

A claim pushes `next_check_at` past the work so nobody else takes the item. Pushed past the
longest the work could take, a holder that dies (SIGKILL, out of memory, a lost machine) keeps its
items from everyone for that long: minutes for a batch of 250. Pushed only one lease ahead and
renewed while the holder is alive, its items are due again within one lease of its death.

Renewal only touches the items still held: those the holder has not released and whose
`next_check_at` is still a value the lease wrote (the holder's own plan for an item, a next check
or none, ends the lease for that item even before it is released).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from types import TracebackType

from django.conf import settings
from django.db import connection

from stopdesk.models import WorkItem
from stopdesk.services.sql import is_postgres

log = logging.getLogger(__name__)

# How many renewals fit in one lease: a renewal may be late by a few intervals (a slow statement,
# a row held by a writer) before the lease runs out under a live holder.
RENEWALS_PER_LEASE = 4


def lease_seconds() -> float:
    return float(settings.STOPDESK.get("RECONCILE_LEASE_SECONDS", 20))


_RENEW_SQL = """
UPDATE stopdesk_workitem SET next_check_at = %(until)s
WHERE id IN (
    SELECT id FROM stopdesk_workitem
    WHERE id = ANY(%(ids)s::bigint[]) AND next_check_at = ANY(%(held)s::timestamptz[])
    FOR NO KEY UPDATE SKIP LOCKED
)
RETURNING id
"""


class ClaimLease:
    """Renews, from a thread of its own, the claim on `item_ids` taken at `now` until `until`
    (`now + lease_seconds()`). Used as a context manager around the work; `release` ends the lease
    for items whose work is done. The lease runs on `now`'s clock (a test's fixed clock too): each
    renewal moves it by the time elapsed since the claim."""

    def __init__(self, *, item_ids: Iterable[int], now: datetime, until: datetime) -> None:
        self._held = set(item_ids)
        self._lease = until - now
        self._claimed_at = now
        self._started = time.monotonic()
        self._untils = [until]
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-lease", daemon=True)

    def release(self, item_ids: Iterable[int]) -> None:
        with self._lock:
            self._held.difference_update(item_ids)

    def __enter__(self) -> ClaimLease:
        if self._held:
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = self._lease.total_seconds() / RENEWALS_PER_LEASE
        try:
            while not self._done.wait(interval):
                try:
                    self.renew()
                except Exception:
                    # The next renewal tries again, on a new connection (this one may be the
                    # one that failed); if none succeeds the lease runs out and the items are due
                    # again, which is the safe side.
                    log.exception("renewing the claim on %d item(s) failed", len(self._held))
                    connection.close()
        finally:
            connection.close()

    def renew(self) -> int:
        """Push the held items' claim one lease past now (on the claim's clock). Returns how many
        rows it moved; a row a writer holds this instant is left for the next renewal."""
        with self._lock:
            ids = sorted(self._held)
        if not ids:
            return 0
        elapsed = timedelta(seconds=time.monotonic() - self._started)
        until = self._claimed_at + elapsed + self._lease
        held = list(self._untils)
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute(_RENEW_SQL, {"ids": ids, "held": held, "until": until})
                moved = len(cursor.fetchall())
        else:  # SQLite: transactions are serialised, no row is held by another writer
            moved = WorkItem.objects.filter(pk__in=ids, next_check_at__in=held).update(next_check_at=until)
        self._untils.append(until)
        return moved
