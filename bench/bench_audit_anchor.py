"""The audit chain anchored outside the database: what signing and delivering the heads costs the
sealer, and the signed export and its offline check.

audit_anchor.seal_per_s        events sealed per second, each batch's heads signed and appended
                               to the anchors file (fsync) before it commits
audit_anchor.anchor_ms         one anchor alone: sign and append the heads of a full batch
audit_anchor.anchor_share      that anchor's time over the whole batch's seal (target <= 0.05)
audit_anchor.export_rows_per_s  `audit_export`: events written to the signed file per second
audit_anchor.offline_rows_per_s  `audit_verify --export --anchors`: events checked per second,
                               no database

Seeds STOPDESK_BENCH_ANCHOR_EVENTS unsealed events (default 200,000, 20 per task) with one
INSERT ... SELECT, as writers leave them (seq 0, no hash).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import Figure

EVENTS = int(os.environ.get("STOPDESK_BENCH_ANCHOR_EVENTS", "200000"))
PER_TASK = 20
FIRST_TASK = 50_000_000  # above any task the other benchmarks make


def _seed(events: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stopdesk_event (at, task_id, item_id, kind, actor, from_state, to_state, message, data)
            SELECT now(), %(first)s + g / %(per)s, NULL, 'note', 'runtime:bench', '', '',
                   'A note, "as asked", by the runtime', '{"attempt": 1}'::jsonb
            FROM generate_series(0, %(events)s - 1) g
            """,
            {"events": events, "per": PER_TASK, "first": FIRST_TASK},
        )
        cursor.execute("ANALYZE stopdesk_event")


def run() -> list[Figure]:
    from django.conf import settings

    from stopdesk.audit_offline import export_verify
    from stopdesk.services.audit_anchor import chain_heads_anchor
    from stopdesk.services.audit_export import audit_export
    from stopdesk.services.audit_seal import BATCH, audit_seal

    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        settings.STOPDESK_AUDIT = {
            **settings.STOPDESK_AUDIT,
            "DEV_KEY_FILE": str(where / "key.pem"),
            "ANCHORS_DIR": str(where / "anchors"),
        }
        _seed(EVENTS)
        started = time.perf_counter()
        sealed = audit_seal(wait=True) or 0
        seal_s = time.perf_counter() - started
        # Made-up heads, anchored apart from the real ones.
        settings.STOPDESK_AUDIT = {**settings.STOPDESK_AUDIT, "ANCHORS_DIR": str(where / "timing")}
        heads = [(FIRST_TASK + n, PER_TASK, "f" * 64) for n in range(BATCH // PER_TASK)]
        anchor_ms = []
        for _ in range(20):
            began = time.perf_counter()
            chain_heads_anchor(heads)
            anchor_ms.append((time.perf_counter() - began) * 1000)
        batch_ms = seal_s * 1000 / max(1, sealed / BATCH)
        export = where / "audit.jsonl"
        began = time.perf_counter()
        exported = audit_export(export)
        export_s = time.perf_counter() - began
        began = time.perf_counter()
        report = export_verify(export, where / "anchors")
        offline_s = time.perf_counter() - began
        megabytes = export.stat().st_size / 2**20
        if report.breaks or report.problems or report.events != exported.events:
            raise AssertionError(f"the export does not verify: {report.breaks[:3]} {report.problems[:3]}")
    anchor = statistics.median(anchor_ms)
    return [
        Figure("audit_anchor.seal_per_s", sealed / seal_s, f"events/s ({sealed} events, anchored)"),
        Figure("audit_anchor.anchor_ms", anchor, f"ms (heads of {len(heads)} chains, median of 20)"),
        Figure("audit_anchor.anchor_share", anchor / batch_ms, f"of a {BATCH}-event batch's seal", target=0.05),
        Figure(
            "audit_anchor.export_rows_per_s",
            exported.events / export_s,
            f"events/s ({megabytes:.0f} MB)",
        ),
        Figure("audit_anchor.offline_rows_per_s", report.events / offline_s, "events/s"),
    ]
