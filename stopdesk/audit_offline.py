"""Checking a chain without the database: recompute its links, compare its heads with the signed
anchors delivered outside, and read a signed export (`manage.py audit_export`).

The export is JSON Lines: a header (format, how the hash is made, the columns, the public key and
its id), then per chain a `chain` line (its head and archive anchor) followed by its events in
seq order (`event`: id, the chain's columns as the hash reads them, hash), and last a `signature`
line: Ed25519 over the SHA-256 of every byte before it. Pure: no Django, no database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stopdesk.audit_db import digest
from stopdesk.audit_sign import Anchored, anchors_read, key_id, signature_valid

EXPORT_FORMAT = "stopdesk-audit-export"
EXPORT_VERSION = 1
EXPORT_COLUMNS = ("seq", "task_id", "item_id", "at", "kind", "actor", "from_state", "to_state", "message", "data")
HASH_RULE = (
    "sha256 over the previous event's hash and the columns, each written as <length>:<text>;"
    " a chain's first hash follows its anchor_hash"
)


@dataclass(frozen=True)
class Break:
    task_id: int
    seq: int
    event_id: int | None
    reason: str

    def __str__(self) -> str:
        where = f"event {self.event_id}" if self.event_id is not None else "chain head"
        return f"task {self.task_id}: {where} (seq {self.seq}): {self.reason}"


@dataclass(frozen=True)
class Head:
    task_id: int
    seq: int
    hash: str
    anchor_seq: int
    anchor_hash: str


def check_chain(
    head: Head, rows: Iterable[tuple[int, str, int, list[Any]]], *, hash_at: int = -1
) -> tuple[Break | None, str | None]:
    """Recompute one chain: rows are (event id, stored hash, seq, columns after seq) in seq order.
    Returns the first broken link (or None) and the stored hash at seq `hash_at`, if it was met."""
    prev, expected, found = head.anchor_hash, head.anchor_seq + 1, None
    if hash_at == head.anchor_seq:
        found = head.anchor_hash
    for event_id, stored, seq, columns in rows:
        if seq <= head.anchor_seq:
            continue  # before the anchor: archived with its month (events_archive)
        if seq != expected:
            what = "an event is missing before it" if seq > expected else "its place is taken twice"
            return Break(head.task_id, seq, event_id, f"seq {expected} expected: {what}"), found
        if digest(prev, seq, *columns) != stored:
            return Break(
                head.task_id, seq, event_id, "its hash does not match its content and the previous link"
            ), found
        if seq == hash_at:
            found = stored
        prev, expected = stored, seq + 1
    if expected - 1 != head.seq or prev != head.hash:
        return Break(
            head.task_id, head.seq, None, f"the head says seq {head.seq}, the last event is seq {expected - 1}"
        ), found
    return None, found


def anchor_break(head: Head | None, signed: tuple[int, str, str], hash_at: str | None, task_id: int) -> Break | None:
    """Compare a chain with the newest head signed for it outside the database. A chain that ends
    before the signed place lost its tail; a different hash there means it was rewritten."""
    seq, value, when = signed
    if head is None:
        return Break(task_id, seq, None, f"the chain is gone, but a head at seq {seq} was signed {when}")
    if seq < head.anchor_seq:
        return None  # archived with its month: the archive's manifest covers it
    if head.seq < seq:
        return Break(
            task_id, seq, None, f"events after seq {head.seq} are missing: a head at seq {seq} was signed {when}"
        )
    if hash_at != value:
        return Break(
            task_id,
            seq,
            None,
            f"the chain was rewritten at or before seq {seq}: its hash there is not the one signed {when}",
        )
    return None


# --- the export ----------------------------------------------------------------------------------


@dataclass
class ExportReport:
    key_id: str = ""
    events: int = 0
    chains: int = 0
    anchored_chains: int = 0
    anchor_lines: int = 0
    breaks: list[Break] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the file or the anchors themselves


def export_verify(path: Path, anchors_dir: Path | None, *, trusted_key: str | None = None) -> ExportReport:
    """Check an export's signature, every chain in it, and (with `anchors_dir`) each chain against
    the newest head signed for it. The export's key must be the trusted key when one is given, and
    one of the anchors' keys otherwise: a file re-signed with another key proves nothing."""
    report = ExportReport()
    lines = _export_lines(path, report)
    if lines is None:
        return report
    header, body = lines
    public = str(header.get("public_key", ""))
    report.key_id = key_id(public)
    if trusted_key is not None and public != trusted_key:
        report.problems.append(f"the export is signed by {report.key_id}, not by the trusted key")
    anchored = anchors_read(anchors_dir, trusted_key=trusted_key) if anchors_dir is not None else None
    if anchored is not None:
        report.problems.extend(anchored.problems or [])
        report.anchor_lines = anchored.lines
        if trusted_key is None and anchored.key_ids and report.key_id not in anchored.key_ids:
            report.problems.append(f"the export is signed by {report.key_id}, which signed none of the anchors")
    _check_chains(body, anchored, report)
    return report


def _export_lines(path: Path, report: ExportReport) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The header and the body of a signed export, or None (with the problem) when the file is not
    one or its signature does not verify."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        report.problems.append(f"{path}: {error.strerror}")
        return None
    body_end = raw.rstrip(b"\n").rfind(b"\n") + 1
    try:
        documents = [json.loads(line) for line in raw[:body_end].splitlines() if line.strip()]
        signature = json.loads(raw[body_end:])
        header = documents[0]
    except (ValueError, IndexError):
        report.problems.append(f"{path}: not a stopdesk audit export (JSON Lines expected)")
        return None
    if header.get("format") != EXPORT_FORMAT or header.get("version") != EXPORT_VERSION:
        report.problems.append(f"{path}: not a stopdesk audit export of version {EXPORT_VERSION}")
        return None
    expected = hashlib.sha256(raw[:body_end]).hexdigest()
    public = str(header.get("public_key", ""))
    if signature.get("sha256") != expected or not signature_valid(
        public, str(signature.get("signature", "")), expected.encode()
    ):
        report.problems.append(f"{path}: the signature does not verify: the file was changed after it was signed")
        return None
    return header, documents[1:]


def _check_chains(body: list[dict[str, Any]], anchored: Anchored | None, report: ExportReport) -> None:
    signed = anchored.heads if anchored is not None else {}
    seen: set[int] = set()
    for head, events in _chains(body):
        seen.add(head.task_id)
        report.chains += 1
        report.events += len(events)
        want = signed.get(head.task_id)
        rows = ((e["event"], e["hash"], int(e["columns"][0]), e["columns"][1:]) for e in events)
        found, hash_at = check_chain(head, rows, hash_at=want[0] if want else -1)
        if found is not None:
            report.breaks.append(found)
        if want is not None:
            report.anchored_chains += 1
            if (late := anchor_break(head, want, hash_at, head.task_id)) is not None:
                report.breaks.append(late)
    for task_id in sorted(set(signed) - seen):
        report.anchored_chains += 1
        if (gone := anchor_break(None, signed[task_id], None, task_id)) is not None:
            report.breaks.append(gone)


def _chains(body: list[dict[str, Any]]) -> Iterator[tuple[Head, list[dict[str, Any]]]]:
    head: Head | None = None
    events: list[dict[str, Any]] = []
    for document in body:
        if "chain" in document:
            if head is not None:
                yield head, events
            head = Head(
                document["chain"], document["seq"], document["hash"], document["anchor_seq"], document["anchor_hash"]
            )
            events = []
        elif head is not None:
            events.append(document)
    if head is not None:
        yield head, events
