"""A signed, self-describing export of the audit chains (format: stopdesk/audit_offline.py), so
that `audit_verify --export FILE --anchors DIR` can check them with no database.

It seals what has committed, then reads every chain from one snapshot, writes the file as it goes
(memory does not grow with the trail) and signs the SHA-256 of everything it wrote."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from django.db import connection

from stopdesk.audit_offline import EXPORT_COLUMNS, EXPORT_FORMAT, EXPORT_VERSION, HASH_RULE
from stopdesk.audit_sign import SigningKey
from stopdesk.services.audit import chain_events
from stopdesk.services.audit_anchor import signing_key
from stopdesk.services.audit_seal import audit_seal, audit_unsealed
from stopdesk.services.sql import read_snapshot


@dataclass(frozen=True)
class Exported:
    path: Path
    chains: int
    events: int
    key_id: str
    unsealed_left_out: int


class _Signed:
    """Lines written and hashed together, so the signature covers exactly the bytes on disk."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha = out, hashlib.sha256()

    def line(self, document: dict[str, Any]) -> None:
        data = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self.out.write(data)
        self.sha.update(data)


def audit_export(path: Path, *, batch: int = 500) -> Exported:
    """Write every sealed chain to `path` (refused if it exists: an export is never overwritten).
    A failure part way removes the file, so a partial export never passes for one."""
    audit_seal(wait=True)
    key = signing_key()
    with open(path, "xb") as out:
        try:
            return _write(out, path, key, batch)
        except BaseException:
            path.unlink()
            raise


def _write(out: IO[bytes], path: Path, key: SigningKey, batch: int) -> Exported:
    with read_snapshot():  # heads and events as of one moment
        signed = _Signed(out)
        signed.line(
            {
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "created_at": datetime.now(UTC).isoformat(),
                "hash": HASH_RULE,
                "columns": list(EXPORT_COLUMNS),
                "key_id": key.key_id,
                "public_key": key.public_b64,
            }
        )
        chains, events = _write_chains(signed, batch)
        left_out = audit_unsealed().events
        sha = signed.sha.hexdigest()
        closing = {"signature": key.sign(sha.encode()), "sha256": sha, "key_id": key.key_id}
        out.write(json.dumps(closing, separators=(",", ":")).encode() + b"\n")
        out.flush()
    return Exported(path, chains, events, key.key_id, left_out)


def _write_chains(signed: _Signed, batch: int) -> tuple[int, int]:
    chains = events = 0
    after = -1
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT task_id, seq, hash, anchor_seq, anchor_hash FROM stopdesk_eventchain"
                " WHERE task_id > %s ORDER BY task_id LIMIT %s",
                [after, batch],
            )
            heads = cursor.fetchall()
        if not heads:
            return chains, events
        by_task: dict[int, list[tuple[Any, ...]]] = {row[0]: [] for row in heads}
        for row in chain_events(list(by_task)):
            by_task[row[0]].append(row)
        for task_id, seq, value, anchor_seq, anchor_hash in heads:
            signed.line(
                {"chain": task_id, "seq": seq, "hash": value, "anchor_seq": anchor_seq, "anchor_hash": anchor_hash}
            )
            for _, event_id, stored, *columns in by_task[task_id]:
                texts = ["" if c is None else str(c) for c in columns]
                signed.line({"event": event_id, "columns": texts, "hash": stored})
            chains += 1
            events += len(by_task[task_id])
        after = heads[-1][0]
