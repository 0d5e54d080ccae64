"""Record ids are data, never path.

An id another system gave us travels back to it inside a URL when we read or reverse the record.
Built naively, `decoy/../crm-59` becomes a path that the HTTP client (or the server) resolves to
`crm-59`, and an approved compensation lands on someone else's record. So every id goes through
`path_segment()` (one percent-encoded segment), ids that no encoding makes safe are refused when
they are recorded (`record_id_problem()`), and what a system reads back must name the recorded id
(`read_back_problem()`).

No Django here: the ledger, the API schemas and the adapters all call the same three functions.
"""

from __future__ import annotations

import unicodedata
from typing import Any
from urllib.parse import quote

MAX_LENGTH = 200  # ExternalRecord.record_id
# Control, format (bidi overrides, zero-width), surrogate, private-use, unassigned, line/paragraph
# separators: invisible or ambiguous in a URL, a log line and a reviewer's page alike.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class UnsafeRecordId(ValueError):
    """The id cannot be sent to its system as one path segment."""


def record_id_problem(record_id: str) -> str | None:
    """Why `record_id` cannot be one URL path segment for any system, or None when it can.

    `/` and `\\` are refused even though they could be percent-encoded: many servers (and proxies)
    decode `%2F` before routing, so the encoded id would still split into two segments there."""
    if not record_id:
        return "must not be empty"
    if len(record_id) > MAX_LENGTH:
        return f"must be at most {MAX_LENGTH} characters"
    if record_id in (".", ".."):
        return "must not be . or .. (a URL reads them as directory steps)"
    if "/" in record_id or "\\" in record_id:
        return "must not contain / or \\ (servers split paths there, even when percent-encoded)"
    if record_id != record_id.strip():
        return "must not start or end with whitespace"
    for char in record_id:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            return f"must not contain control or invisible characters (U+{ord(char):04X})"
    return None


def path_segment(record_id: str) -> str:
    """`record_id` as exactly one percent-encoded path segment; `?`, `#`, `%`, spaces and
    non-ASCII letters are encoded, never interpreted. Raises UnsafeRecordId for the rest."""
    problem = record_id_problem(record_id)
    if problem is not None:
        raise UnsafeRecordId(f"record id {record_id[:80]!r} {problem}")
    return quote(record_id, safe="")


def read_back_problem(recorded_id: str, body: Any, id_field: str = "id") -> str | None:
    """Whether a system's answer names the record we recorded. A system may answer for another
    record (after a merge, through an alias or a rewriting proxy); writing then would act on the
    wrong one, so a missing or different id is a problem."""
    read = body.get(id_field) if isinstance(body, dict) else None
    if read is None:
        return f"the answer does not name a record ({id_field!r} is missing); expected {recorded_id!r}"
    if str(read) != recorded_id:
        return f"asked for record {recorded_id!r}, the system answered with record {str(read)!r}"
    return None
