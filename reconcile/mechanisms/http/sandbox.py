"""A CRM with versioned records: the external system whose effects Stop must reconcile.

- `POST /records` with `Idempotency-Key`: a replay returns the same record (200, not 201);
  the same key with a different body is 422, as with Stripe-style APIs.
- `GET /records/{id}`: the record with an integer `version` and an `ETag: "v<version>"`.
- `GET /records?idempotency_key=K`: how a caller whose create timed out learns whether it
  landed (404 when it never did).
- `POST /records/{id}/edit` with `X-Actor`: someone else changes the record (version + 1),
  which is what makes a compensation's version check matter.
- `POST /records/{id}/archive` requires `If-Match` (428 without, 412 with the current
  version on mismatch). Retrying an archive that already happened from that version is a
  200 replay, so an approved compensation can be retried safely.
- Records merged into another (`merge()`) answer reads and writes as the surviving record, as
  CRMs do after a merge: a caller that trusts the path rather than the id it reads back acts on
  the survivor.
- `/` is a small HTML page with an "edit as someone else" button for the walkthrough.

Faults (global, or aimed at a record id or idempotency key): `fail_500` (nothing applied),
`fail_500_after_commit` (applied, then 500), `hang` (parked before applying, never answers)
and `hang_after_commit` (applied, never answers): the four ways a write can look to a caller.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from stopdrill.sandbox.common import SandboxParty

FAIL_500 = "fail_500"
FAIL_500_AFTER_COMMIT = "fail_500_after_commit"
HANG = "hang"
HANG_AFTER_COMMIT = "hang_after_commit"
WRITE_FAULTS = frozenset({FAIL_500, FAIL_500_AFTER_COMMIT, HANG, HANG_AFTER_COMMIT})
READ_500 = "read_500"  # reads fail too: the caller cannot even reconcile for a while


@dataclass
class Record:
    id: str
    fields: dict[str, Any]
    idempotency_key: str | None
    created_with: dict[str, Any]  # the create body, to tell a replay from a key reused for other data
    version: int = 1
    status: str = "active"
    archived_from_version: int | None = None
    created_at: float = field(default_factory=time.time)
    updated_by: str = "stopdesk"
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def etag(self) -> str:
        return f'"v{self.version}"'

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fields": dict(self.fields),
            "idempotency_key": self.idempotency_key,
            "version": self.version,
            "etag": self.etag,
            "status": self.status,
            "created_at": self.created_at,
            "updated_by": self.updated_by,
            "history": list(self.history),
        }

    def bump(self, actor: str, action: str) -> None:
        self.version += 1
        self.updated_by = actor
        self.history.append({"version": self.version, "actor": actor, "action": action, "at": time.time()})


class CRM(SandboxParty):
    """State and behaviour; `app()` builds a fresh Starlette app over it.

    Python control: `configure(latency_s=...)`, `set_fault(...)`, `records()`, `get(id)`,
    `edit(id, actor, **fields)`, `stats()`, `reset()`. HTTP: `/_control/*`.
    """

    FAULTS: ClassVar[frozenset[str]] = WRITE_FAULTS | {READ_500}
    # id_prefix: some systems name records like paths ("accounts/7", Google-style resource names),
    # which stopdesk must not record as an id it will later put in a URL.
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = ("latency_s", "id_prefix")

    def __init__(self, *, latency_s: float = 0.0) -> None:
        super().__init__(latency_s=latency_s)
        self.id_prefix = "crm-"
        self._records: dict[str, Record] = {}
        self._by_key: dict[str, str] = {}
        self._merged: dict[str, str] = {}
        self._next_id = 1

    # --- Python control API -----------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.to_json() for r in self._records.values()]

    def get(self, record_id: str) -> dict[str, Any] | None:
        with self.lock:
            record = self._records.get(record_id)
            return record.to_json() if record else None

    def edit(self, record_id: str, actor: str = "someone else", **fields: Any) -> dict[str, Any]:
        """Change a record behind stopdesk's back, as a colleague in the CRM would."""
        with self.lock:
            record = self._records[record_id]
            record.fields.update(fields)
            record.bump(actor, "edit")
            return record.to_json()

    def seed(self, record_id: str, **fields: Any) -> dict[str, Any]:
        """A record that exists already (imported, or made by a person) under an id of its own."""
        with self.lock:
            record = Record(id=record_id, fields=dict(fields), idempotency_key=None, created_with=dict(fields))
            self._records[record_id] = record
            return record.to_json()

    def merge(self, record_id: str, *, into: str) -> None:
        """Merge one record into another: its id now answers as the survivor."""
        with self.lock:
            self._merged[record_id] = into
            self._records.pop(record_id, None)

    def _find(self, record_id: str) -> Record | None:
        return self._records.get(self._merged.get(record_id, record_id))

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.id_prefix = "crm-"
            self._records.clear()
            self._by_key.clear()
            self._merged.clear()
            self._next_id = 1

    # --- HTTP handlers ----------------------------------------------------------------

    async def _create(self, request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        await self.arrive("create", key)
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body must be a JSON object")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        if pre := await self._before_commit(key):
            return pre
        with self.lock:
            existing = self._records.get(self._by_key.get(key, "")) if key else None
            if existing is not None:
                if existing.created_with != body:
                    return _error(422, "Idempotency-Key was already used with a different body")
                return _record_response(existing, 200)
            record = Record(
                id=f"{self.id_prefix}{self._next_id}", fields=dict(body), idempotency_key=key, created_with=dict(body)
            )
            record.history.append({"version": 1, "actor": "stopdesk", "action": "create", "at": record.created_at})
            self._next_id += 1
            self._records[record.id] = record
            if key:
                self._by_key[key] = record.id
            created = record.to_json()
        if post := await self._after_commit(key, record.id):
            return post
        return JSONResponse(created, status_code=201, headers={"ETag": record.etag})

    async def _list(self, request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        await self.arrive("lookup" if key else "list", key)
        if self.has_fault(READ_500, key):
            return _error(500, "internal error")
        with self.lock:
            if key is None:
                return JSONResponse({"data": [r.to_json() for r in self._records.values()]})
            record = self._records.get(self._by_key.get(key, ""))
            if record is None:
                return _error(404, f"no record was created with idempotency key {key!r}")
            return _record_response(record, 200)

    async def _get(self, request: Request) -> Response:
        record_id = request.path_params["record_id"]
        await self.arrive("get", record_id)
        if self.has_fault(READ_500, record_id):
            return _error(500, "internal error")
        with self.lock:
            record = self._find(record_id)
            if record is None:
                return _error(404, f"no record {record_id!r}")
            return _record_response(record, 200)

    async def _edit(self, request: Request) -> Response:
        record_id = request.path_params["record_id"]
        await self.arrive("edit", record_id)
        from_form = request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
        if from_form:
            form = await request.form()
            actor = str(form.get("actor") or "someone else")
            changes: dict[str, Any] = {"note": f"edited by {actor} at {time.strftime('%H:%M:%S')}"}
        else:
            actor = request.headers.get("x-actor") or "someone else"
            try:
                changes = await request.json()
            except ValueError:
                changes = {}
            if not isinstance(changes, dict):
                return _error(400, "body must be a JSON object")
        if pre := await self._before_commit(record_id):
            return pre
        with self.lock:
            record = self._find(record_id)
            if record is None:
                return _error(404, f"no record {record_id!r}")
            if record.status == "archived":
                return _error(409, "archived records cannot be edited", version=record.version)
            record.fields.update(changes)
            record.bump(actor, "edit")
            edited = record.to_json()
        if post := await self._after_commit(record_id, record_id):
            return post
        if from_form:
            return RedirectResponse("/", status_code=303)
        return JSONResponse(edited, headers={"ETag": record.etag})

    async def _archive(self, request: Request) -> Response:
        record_id = request.path_params["record_id"]
        await self.arrive("archive", record_id)
        if_match = request.headers.get("if-match")
        if if_match is None:
            return _error(428, "archive requires If-Match with the version you last read")
        if pre := await self._before_commit(record_id):
            return pre
        actor = request.headers.get("x-actor") or "stopdesk"
        with self.lock:
            record = self._find(record_id)
            if record is None:
                return _error(404, f"no record {record_id!r}")
            expected = _parse_if_match(if_match)
            if record.status == "archived" and expected in (record.archived_from_version, record.version):
                return _record_response(record, 200)  # a retried archive: already done
            if expected != "*" and expected != record.version:
                return _error(
                    412,
                    f"record is at version {record.version}, not {if_match}",
                    version=record.version,
                    etag=record.etag,
                )
            record.archived_from_version = record.version
            record.status = "archived"
            record.bump(actor, "archive")
            archived = record.to_json()
        if post := await self._after_commit(record_id, record_id):
            return post
        return JSONResponse(archived, headers={"ETag": record.etag})

    async def _before_commit(self, *targets: str | None) -> Response | None:
        if self.has_fault(HANG, *targets):
            await self.hang()
        if self.has_fault(FAIL_500, *targets):
            return _error(500, "internal error")
        return None

    async def _after_commit(self, *targets: str | None) -> Response | None:
        if self.has_fault(HANG_AFTER_COMMIT, *targets):
            await self.hang()
        if self.has_fault(FAIL_500_AFTER_COMMIT, *targets):
            return _error(500, "internal error")
        return None

    async def _page(self, request: Request) -> HTMLResponse:
        with self.lock:
            rows = "".join(_row(r) for r in self._records.values())
        return HTMLResponse(_PAGE.format(rows=rows or '<tr><td colspan="5">No records yet.</td></tr>'))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/", self._page, methods=["GET"]),
                Route("/records", self._create, methods=["POST"]),
                Route("/records", self._list, methods=["GET"]),
                Route("/records/{record_id}", self._get, methods=["GET"]),
                Route("/records/{record_id}/edit", self._edit, methods=["POST"]),
                Route("/records/{record_id}/archive", self._archive, methods=["POST"]),
                *self.control_routes(),
            ]
        )


def _parse_if_match(value: str) -> int | str | None:
    value = value.strip()
    if value == "*":
        return "*"
    value = value.removeprefix("W/").strip('"').removeprefix("v")
    try:
        return int(value)
    except ValueError:
        return None


def _record_response(record: Record, status: int) -> JSONResponse:
    return JSONResponse(record.to_json(), status_code=status, headers={"ETag": record.etag})


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _row(record: Record) -> str:
    name = html.escape(str(record.fields.get("name", "")))
    button = (
        f'<form method="post" action="/records/{record.id}/edit">'
        '<input type="hidden" name="actor" value="someone else">'
        "<button>Edit as someone else</button></form>"
        if record.status == "active"
        else ""
    )
    return (
        f"<tr><td>{record.id}</td><td>{name}</td><td>v{record.version}</td>"
        f"<td>{record.status}</td><td>{button}</td></tr>"
    )


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sandbox CRM</title></head>
<body><h1>Sandbox CRM</h1>
<p>Records created by agents. Editing one here bumps its version, so a later compensation
that expected the old version is escalated instead of forced.</p>
<table><thead><tr><th>Id</th><th>Name</th><th>Version</th><th>Status</th><th></th></tr></thead>
<tbody>{rows}</tbody></table></body></html>
"""


# What the sandbox's start-all and the drills' sandbox find through the mechanism folders.
PARTY = CRM
PARTY_NAME = "crm"  # its key in `Sandbox.urls` and the name of its server
URL_SUFFIX = ""  # what a client's base URL adds to the server's
# (method, path) patterns that are actions, work that must pass the boundary first (the drills
# time them against Stop); reads, lookups and cancels are what Stop itself sends afterwards.
ACTIONS = [("POST", re.compile(r"^/records$")), ("POST", re.compile(r"^/records/[^/]+/(edit|archive)$"))]
DRILL_OPTIONS: dict[str, float] = {}  # how the drills' sandbox builds it
