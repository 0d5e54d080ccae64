"""Rows out of the ledger as CSV or JSON Lines, streamed: the memory an export takes does not
grow with the number of rows.

The rows come from `QuerySet.values_list(...).iterator(chunk_size=...)`, which on PostgreSQL reads
through a server-side cursor (a named cursor, `chunk_size` rows per fetch), so a million events
never sit in the web process at once. Each chunk of rows is encoded and handed on as one piece of
the response body. Outside a transaction Django declares that cursor WITH HOLD: PostgreSQL keeps
the result on its side, and no transaction stays open while a slow download drains it.

A CSV is opened in spreadsheets, which run a cell that starts with = + - @ (or a tab or carriage
return) as a formula: such a cell gets a leading apostrophe, the usual defence, so a message or a
reason written by an agent cannot run in an auditor's spreadsheet. JSON Lines keeps values as
they are: it is read by programs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

CHUNK_ROWS = 2_000
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Format:
    name: str
    label: str
    content_type: str
    extension: str


FORMATS = {
    "csv": Format("csv", "CSV", "text/csv; charset=utf-8", "csv"),
    "jsonl": Format("jsonl", "JSON Lines", "application/jsonl; charset=utf-8", "jsonl"),
}


@dataclass(frozen=True)
class Column:
    """One exported column: its header and the lookup it reads (`task_id`, `proposed_by__username`)."""

    header: str
    lookup: str


def columns(*specs: str | tuple[str, str]) -> tuple[Column, ...]:
    """`"kind"` is a column named after its lookup; `("proposed_by", "proposed_by__username")` names it."""
    return tuple(Column(s, s) if isinstance(s, str) else Column(*s) for s in specs)


def plain(value: Any) -> Any:
    """A value as JSON has it: times in ISO 8601 with their seconds and offset."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_STARTS) else value
    return str(plain(value))


def csv_chunks(headers: Sequence[str], rows: Iterable[Sequence[Any]], chunk_rows: int = CHUNK_ROWS) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(headers)
    pending = 0
    for row in rows:
        writer.writerow([csv_cell(v) for v in row])
        pending += 1
        if pending >= chunk_rows:
            yield _drain(buffer)
            pending = 0
    yield _drain(buffer)


def jsonl_chunks(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], chunk_rows: int = CHUNK_ROWS
) -> Iterator[bytes]:
    lines: list[str] = []
    for row in rows:
        lines.append(json.dumps(dict(zip(headers, map(plain, row), strict=True)), ensure_ascii=False))
        if len(lines) >= chunk_rows:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _drain(buffer: io.StringIO) -> bytes:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text.encode()


def export_chunks(queryset: QuerySet[Any], cols: Sequence[Column], fmt: Format) -> Iterator[bytes]:
    """The body of an export of `queryset`, in pieces of CHUNK_ROWS rows, read through a server-side
    cursor (`iterator(chunk_size=...)`)."""
    size = CHUNK_ROWS
    rows = queryset.values_list(*(c.lookup for c in cols)).iterator(chunk_size=size)
    headers = [c.header for c in cols]
    return csv_chunks(headers, rows, size) if fmt.name == "csv" else jsonl_chunks(headers, rows, size)
