"""The agent door: the requests a framework run makes most, on the watch server's event loop.

`POST /api/v1/tasks/{task_id}/items/started` is the one on an agent's path before each tool call
and model request (registered, and through the boundary), so its cost is the agent's wait;
`POST /api/v1/results` and `POST /api/v1/items/{item_id}/result` carry the calls' results, off the
agent's path but competing with it for the machine. Served by Django (`stopdesk.api.views`) each
pays Django's request path, about as much again as the ledger's own work. Here each is the
ledger's statements on a connection of this loop's own: the token's read (once: a token read
before is checked inside the statements that follow, `_runtime`), then the boundary's one
statement (`item_register_started_async`), which also stores the Idempotency-Key's answer (one
statement, its own commit), or each running item's result in one statement
(`item_close_running_of_runtime_async`), in one transaction, and then the settle check of a task
no run holds open (`tasks_settle_async`). The
clients send them here once they know the watch server (`watch_url`, or the web door's 307 for a
watch), and to the web door before.

The same request gets the same answer at both doors. What the door reads before the ledger (the
token, the path's id, the key, the body) is refused here with the errors Django's view gives
(`stopdesk.api.reading`, the same schemas). Every other case that is not plain — a task stopped,
closed or not this runtime's, a parent named, a readiness policy, a repeated Idempotency-Key, a
late result or a "stopped" report, SQLite — has written nothing here (the transaction is rolled
back) and goes on to Django's view in this process, which answers it as the web door does (its
WSGI handler, on a few threads of the door's own: Django's ASGI handler would give each request a
thread, and so a database connection, of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from django.core.handlers.wsgi import WSGIHandler
from psycopg_pool import AsyncConnectionPool

from stopdesk.agent import schemas
from stopdesk.agent.runtime import LocalRuntime
from stopdesk.api.idempotency import STORE_STARTED_ANSWER_SQL, request_fingerprint
from stopdesk.api.reading import MAX_BODY_BYTES, json_body, request_key, too_large
from stopdesk.asgi_io import read_body, request_headers, send_json
from stopdesk.models import Runtime
from stopdesk.protocol.errors import PayloadTooLarge, StopdeskError
from stopdesk.protocol.ids import path_id
from stopdesk.protocol.types import ResultInfo, ResultsInfo, StartedInfo
from stopdesk.services.items import item_register_started_async
from stopdesk.services.runtimes import bearer_token, runtime_for_async
from stopdesk.services.sql import (
    TokenHeld,
    close_thread_connections,
    is_postgres,
    loop_connection_params,
)
from stopdesk.services.transitions import Then, item_close_running_of_runtime_async, tasks_settle_async
from stopdesk.tracing import server_span

log = logging.getLogger(__name__)
STARTED_ROUTE = "/api/v1/tasks/{task_id}/items/started"
RESULTS_ROUTE = "/api/v1/results"
RESULT_ROUTE = "/api/v1/items/{item_id}/result"
OPERATION = "register_started:{task_id}"  # the Idempotency-Key's scope, as Django's view stores it
# Connections per event loop: registrations beyond this wait on the loop for one, costing nothing.
POOL_SIZE = 8
POOL_WAIT_S = 10.0
COMMIT_UNKNOWN = {
    "error": "commit_unknown",
    "detail": "The database did not confirm the commit: send the request again with the same Idempotency-Key.",
}

# The runtimes of the tokens this door has read, by the token's hash (`_runtime`), the first read
# forgotten first past this many.
TOKENS_REMEMBERED = 1024
_tokens: dict[str, Runtime] = {}
_tokens_lock = threading.Lock()

# The threads that run Django's view for what is not a plain registration.
DJANGO_THREADS = 4
_django_threads = ThreadPoolExecutor(max_workers=DJANGO_THREADS, thread_name_prefix="stopdesk-agent-door")
_wsgi: WSGIHandler | None = None
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool[Any]]] = (
    weakref.WeakKeyDictionary()
)


class _Elsewhere(Exception):
    """Not a plain registration: nothing was written here, and Django answers it."""


async def asgi_register_started(scope: dict[str, Any], receive: Any, send: Any, task_id: str) -> None:
    """POST /api/v1/tasks/{task_id}/items/started."""
    await _door(scope, receive, send, STARTED_ROUTE, 201, lambda headers, body: _register(headers, body, task_id))


async def asgi_write_results(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """POST /api/v1/results."""
    await _door(scope, receive, send, RESULTS_ROUTE, 200, _results)


async def asgi_finish_fast(scope: dict[str, Any], receive: Any, send: Any, item_id: str) -> None:
    """POST /api/v1/items/{item_id}/result."""
    await _door(scope, receive, send, RESULT_ROUTE, 200, lambda headers, body: _result(headers, body, item_id))


async def _door(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    route: str,
    status: int,
    serve: Callable[[dict[str, str], bytes], Awaitable[dict[str, Any]]],
) -> None:
    headers = request_headers(scope)
    body = await read_body(receive, keep_at_most=MAX_BODY_BYTES)  # past it, json_body refuses it
    if body is None:
        return  # the client left before sending its request
    if scope.get("method") != "POST" or not is_postgres():
        await _django(scope, body, send)
        return
    attributes = {"http.request.method": "POST", "http.route": route, "url.path": scope.get("path", "")}
    with server_span(headers, f"POST {route}", attributes) as span:
        extra: list[tuple[str, str]] = []
        try:
            answer = await serve(headers, body)
        except _Elsewhere:
            span.set_attribute("stopdesk.agent_door", "django")
            await _django(scope, body, send)
            return
        except StopdeskError as exc:
            status, answer, extra = exc.status, exc.to_json(), exc.headers()
        except _CommitUnknown:
            # What it wrote is unknown, so it is not handed on (a registration could be written
            # twice): the client sends it again (503), and a registration's key then finds the
            # first answer if it landed (a result written twice changes nothing).
            log.exception("agent door: POST %s: the commit's outcome is unknown", scope.get("path"))
            status, answer = 503, COMMIT_UNKNOWN
        span.set_attribute("http.response.status_code", status)
    await send_json(send, status, answer, extra)


async def _register(headers: dict[str, str], body: bytes, task: str) -> dict[str, Any]:
    """The registration's answer (StartedInfo's JSON), the request read in the order Django's view
    reads it: raises what it refuses there, or _Elsewhere having written nothing."""
    async with _connection() as conn, _runtime(conn, headers) as (runtime, held):
        task_id = path_id(task, "task_id")
        key = request_key(headers.get("idempotency-key"))
        args = schemas.RegisterStarted.parse(_json(headers, body))
        if args.parent is not None:
            raise _Elsewhere  # the parent's task is checked first, with the ORM
        return await _registered(conn, runtime, held, task_id, key, args)


async def _results(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """Several results (ResultsInfo's JSON), as `_register` reads a registration."""
    async with _connection() as conn, _runtime(conn, headers) as (runtime, held):
        args = schemas.WriteResults.parse(_json(headers, body))
        rows = [(r.item, r.status, r.detail, r.open_item) for r in args.results]
        await _closed(conn, runtime, held, rows)
        return ResultsInfo(items=[result.item for result in args.results]).to_json()


async def _result(headers: dict[str, str], body: bytes, item: str) -> dict[str, Any]:
    """One result (ResultInfo's JSON), as `_register` reads a registration."""
    async with _connection() as conn, _runtime(conn, headers) as (runtime, held):
        item_id = path_id(item, "item_id")
        args = schemas.FinishFast.parse(_json(headers, body))
        await _closed(conn, runtime, held, [(item_id, args.status, args.detail, args.open_item)])
        return ResultInfo(item=item_id, status=args.status).to_json()


@contextlib.asynccontextmanager
async def _runtime(
    conn: psycopg.AsyncConnection[Any], headers: dict[str, str]
) -> AsyncIterator[tuple[Runtime, TokenHeld | None]]:
    """The request's runtime. A token this door has not read yet is read first, as Django's view
    reads it. A token read before is remembered (`_tokens`), and the ledger's statements then check
    in themselves that its runtime still holds it (`TokenHeld`): the read skipped, a round trip
    on every registration, is made in the write's own statement, so a token revoked or rotated
    before it is refused, as a read would refuse it. A request refused on its input (a bad body,
    path or key) reads the token then, before its refusal, so a revoked token is refused as such,
    first, as at the web door; a request handed to Django forgets the token (Django reads it)."""
    authorization = headers.get("authorization", "")
    token = bearer_token(authorization)
    token_hash = Runtime.hash_token(token) if token else ""
    known = _tokens.get(token_hash) if token_hash else None
    if known is None:
        runtime = await runtime_for_async(conn, authorization)
        _remember(token_hash, runtime)
        yield runtime, None
        return
    try:
        yield known, TokenHeld(token_hash, known.name)
    except _Elsewhere:
        _tokens.pop(token_hash, None)
        raise
    except StopdeskError:
        _tokens.pop(token_hash, None)
        _remember(token_hash, await runtime_for_async(conn, authorization))  # its Unauthorized comes first
        raise


def _remember(token_hash: str, runtime: Runtime) -> None:
    with _tokens_lock:  # a door's loops (one a process, more in the tests) share what it remembers
        _tokens[token_hash] = runtime
        while len(_tokens) > TOKENS_REMEMBERED:
            _tokens.pop(next(iter(_tokens)))  # the one remembered first


def _json(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    if too_large(headers.get("content-length")):
        raise PayloadTooLarge(f"The body is larger than {MAX_BODY_BYTES} bytes.")
    return json_body(body)


@contextlib.asynccontextmanager
async def _connection() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """One of this loop's connections. A failure that is neither a refusal nor a commit's unknown
    outcome (no connection, the token's read failed) wrote nothing: Django answers it."""
    try:
        pool = await _pool()
        async with pool.connection() as conn:
            yield conn
    except (StopdeskError, _Elsewhere, _CommitUnknown):
        raise
    except Exception as exc:
        raise _Elsewhere from exc


class _CommitUnknown(Exception):
    """The commit failed or its answer was lost: what it wrote is unknown."""


async def _registered(
    conn: psycopg.AsyncConnection[Any],
    runtime: Any,
    held: TokenHeld | None,
    task_id: int,
    key: str | None,
    args: schemas.RegisterStarted,
) -> dict[str, Any]:
    """The registration and the answer stored under the key in one statement, on a connection in
    autocommit: that statement is its commit. A key stored already fails it whole (Django then
    replays the first answer)."""
    then = None
    if key is not None:
        answer_but_id = {k: v for k, v in StartedInfo(id=0, task=task_id).to_json().items() if k != "id"}
        then = Then(
            STORE_STARTED_ANSWER_SQL,
            {
                "then_runtime": runtime.pk,
                "then_key": key,
                "then_endpoint": OPERATION.format(task_id=task_id),
                "then_answer": json.dumps(answer_but_id),
                "then_fingerprint": request_fingerprint(args),
            },
        )
    try:
        item_id = await item_register_started_async(
            conn,
            task_id=task_id,
            actor=_actor(runtime),
            runtime_id=runtime.pk,
            held=held,
            then=then,
            **args.model_dump(),
        )
    except Exception as exc:
        if conn.broken:
            # The connection was lost with the statement sent: it may have committed.
            raise _CommitUnknown from exc
        # A refusal of the ledger's (stopped, closed, held, a declaration it refuses) before the
        # statement, or the database's refusal of it (a key stored already): nothing written.
        raise _Elsewhere from exc
    if item_id is None:
        raise _Elsewhere  # no such task of this runtime: Django's NotFound
    return StartedInfo(id=item_id, task=task_id).to_json()


async def _closed(
    conn: psycopg.AsyncConnection[Any],
    runtime: Any,
    held: TokenHeld | None,
    rows: list[tuple[int, str, str, int | None]],
) -> None:
    """Each running item's result in one statement, all in one transaction; then, once committed,
    whether the tasks that no run holds open have settled (a run's own end, most often), as
    Django's view checks after its commit. Any other result (a "stopped" report, a late result, an
    item not running or not this runtime's) is Django's, with the others: the request is all or
    nothing there as here."""
    actor = _actor(runtime)
    unheld: set[int] = set()
    async with _transaction(conn):
        for item_id, status, detail, open_item in rows:
            if status not in ("completed", "failed"):
                raise _Elsewhere
            written = await item_close_running_of_runtime_async(
                conn,
                item_id=item_id,
                succeeded=status == "completed",
                actor=actor,
                outcome=detail,
                runtime_id=runtime.pk,
                open_item=open_item,
                held=held,
            )
            if written is None:
                raise _Elsewhere
            task_id, held_open = written
            if not held_open:
                unheld.add(task_id)
    try:
        await tasks_settle_async(conn, unheld)
    except Exception:
        # The results are committed, and the answer says so; the sweep (`tasks_settle_sweep`)
        # settles a task whose check failed here.
        log.exception("agent door: the settle check of tasks %s failed after their results", sorted(unheld))


def _actor(runtime: Any) -> str:
    return LocalRuntime(runtime=runtime).actor


@contextlib.asynccontextmanager
async def _transaction(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """A transaction whose failures before its commit wrote nothing (_Elsewhere: Django answers),
    and whose commit's failure is _CommitUnknown."""
    committing = False
    try:
        async with conn.transaction():
            yield
            committing = True
    except _Elsewhere:
        raise
    except Exception as exc:
        if committing:
            raise _CommitUnknown from exc
        # A refusal of the ledger's (stopped, closed, held, a declaration it refuses) or the
        # database's error, before the commit: rolled back, nothing written.
        raise _Elsewhere from exc


async def _pool() -> AsyncConnectionPool[Any]:
    """This loop's pool of autocommit connections, opened on its first registration."""
    loop = asyncio.get_running_loop()
    opened = _pools.get(loop)
    if opened is None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            kwargs={**loop_connection_params(), "autocommit": True},
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            timeout=POOL_WAIT_S,
            name="stopdesk-agent-door",
        )

        async def open_pool() -> AsyncConnectionPool[Any]:
            await pool.open(wait=False)
            return pool

        opened = _pools[loop] = loop.create_task(open_pool())
    return await asyncio.shield(opened)


async def close_pools() -> None:
    """Close this loop's pool (the server's shutdown; tests)."""
    opened = _pools.pop(asyncio.get_running_loop(), None)
    if opened is not None:
        await (await opened).close()


async def _django(scope: dict[str, Any], body: bytes, send: Any) -> None:
    """The request answered by Django's own view, on one of a few threads of this door's (so of
    database connections, kept from request to request as a web server's threads keep theirs)."""
    status, headers, content = await asyncio.get_running_loop().run_in_executor(
        _django_threads, _served_by_django, _environ(scope, body)
    )
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def _served_by_django(environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    global _wsgi
    if _wsgi is None:
        _wsgi = WSGIHandler()
    started: list[Any] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
    ) -> Callable[[bytes], object]:
        started[:] = [int(status.split(" ", 1)[0]), [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]]
        return _no_write

    response = _wsgi(environ, start_response)
    try:
        content = b"".join(response)
    finally:
        response.close()  # Django's request_finished: the thread's connection kept or closed as by a web server
    return started[0], started[1], content


def _no_write(data: bytes) -> None:
    raise RuntimeError("Django answers with its response's content, never through write()")


def _environ(scope: dict[str, Any], body: bytes) -> dict[str, Any]:
    """The WSGI environment of an ASGI request whose body was read already (PEP 3333)."""
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope.get("method", "GET"),
        "SCRIPT_NAME": scope.get("root_path", ""),
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 80),
        "REMOTE_ADDR": str(client[0]),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope.get("headers", []):
        name, value = raw_name.decode("latin-1").upper().replace("-", "_"), raw_value.decode("latin-1")
        if name == "CONTENT_LENGTH":
            continue  # the body's own length, read already
        key = name if name == "CONTENT_TYPE" else f"HTTP_{name}"
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def close_django_threads() -> None:
    """Close the database connections of the threads that run Django's view (tests, before
    dropping the database)."""
    close_thread_connections(_django_threads, DJANGO_THREADS)
