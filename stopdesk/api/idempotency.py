"""The API's Idempotency-Key store: a repeated request is answered with its first answer, and the
same key with another body is refused. The HTTP door wraps a runtime call in `once` (or
`once_transition`, for the boundary's transitions); the runtime itself knows nothing of keys."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from pydantic import BaseModel

from stopdesk.models import ApiIdempotency, Runtime
from stopdesk.protocol.errors import Conflict, IdempotencyKeyReused, StopdeskError, StopRequested
from stopdesk.protocol.types import ItemInfo, RecordInfo, StartedInfo, TaskInfo
from stopdesk.services.sql import is_postgres


def once_transition(
    runtime: Runtime | None,
    key: str | None,
    operation: str,
    kind: type[ItemInfo],
    produce: Callable[[], ItemInfo],
    args: BaseModel,
) -> ItemInfo:
    """Like `once`, for the boundary's transitions, which refuse a repeat on their own (a started
    item cannot start again). So the work goes first, and the stored answer is read only when the
    ledger refuses: one round trip less on every start and submit. A concurrent twin waits on the
    item's row lock, so the winner's answer is committed when it looks."""
    if not key or runtime is None:
        return produce()
    fingerprint = request_fingerprint(args)
    # No atomic block of our own around the work: the boundary is one statement, and its
    # refusals (a Conflict, or StopRequested after it cancelled the item) must leave the
    # caller's transaction usable and the cancellation recorded.
    try:
        result = produce()
    except Conflict:
        seen = ApiIdempotency.objects.filter(runtime=runtime, key=key, endpoint=operation).first()
        if seen is None:
            raise
        return kind.from_json(_replayable(seen, fingerprint))
    ApiIdempotency.objects.create(
        runtime=runtime,
        key=key,
        endpoint=operation,
        status=200,
        body=result.to_json(),
        fingerprint=fingerprint,
    )
    return result


def once_work_first(
    runtime: Runtime | None,
    key: str | None,
    operation: str,
    kind: type[StartedInfo],
    produce: Callable[[], StartedInfo],
    args: BaseModel,
) -> StartedInfo:
    """Like `once`, for the request on an agent's path before each tool call (a registration with
    its boundary pass), inside the door's transaction: the work goes first, and its answer is
    stored after it by one statement that also finds an answer stored already. So a first request
    (nearly every one) costs one statement for its key, not two. A repeat does the work again and
    rolls the whole request back (the door's transaction), answering with the first answer."""
    if not key or runtime is None or not connection.in_atomic_block or not is_postgres():
        return once(runtime, key, operation, kind, produce, args)  # STORE_ANSWER_SQL is PostgreSQL's
    fingerprint = request_fingerprint(args)
    try:
        result = produce()
    except StopdeskError as refusal:
        # A refusal (the boundary's commits: the cancelled item is the record), unless this repeats
        # a request that was answered before the task stopped or closed: then nothing of this one
        # stays and the first answer is the answer.
        try:
            seen = ApiIdempotency.objects.filter(runtime=runtime, key=key, endpoint=operation).first()
        except DatabaseError:
            raise refusal from None
        if seen is None:
            raise
        return _replay_rolled_back(kind, seen, fingerprint)
    with connection.cursor() as cursor:
        cursor.execute(STORE_ANSWER_SQL, [runtime.pk, key, operation, json.dumps(result.to_json()), fingerprint])
        stored = cursor.fetchone() is not None
    if stored:
        return result
    # A twin stored its answer first (a repeat, or a concurrent one that committed meanwhile).
    return _replay_rolled_back(
        kind, ApiIdempotency.objects.get(runtime=runtime, key=key, endpoint=operation), fingerprint
    )


STORE_ANSWER_SQL = """
INSERT INTO stopdesk_apiidempotency (runtime_id, key, endpoint, status, body, fingerprint, created_at)
VALUES (%s, %s, %s, 200, %s::jsonb, %s, now())
ON CONFLICT (runtime_id, key, endpoint) DO NOTHING
RETURNING id
"""


# The answer of a registration stored by the registration's own statement (`Then`: the agent
# door's), from the new item `i`: a plain INSERT, so a key already stored fails the whole statement,
# which then wrote nothing (the web door then answers with the first answer).
STORE_STARTED_ANSWER_SQL = """
INSERT INTO stopdesk_apiidempotency (runtime_id, key, endpoint, status, body, fingerprint, created_at)
SELECT %(then_runtime)s::bigint, %(then_key)s::text, %(then_endpoint)s::text, 200,
       %(then_answer)s::jsonb || jsonb_build_object('id', i.id), %(then_fingerprint)s::text, now()
FROM i
"""


def _replay_rolled_back[T: (TaskInfo, ItemInfo, RecordInfo, StartedInfo)](
    kind: type[T], seen: ApiIdempotency, fingerprint: str
) -> T:
    # Read before the rollback is marked: the transaction takes no statement after that.
    answer = _replayable(seen, fingerprint)
    transaction.set_rollback(True)
    return kind.from_json(answer)


def once[T: (TaskInfo, ItemInfo, RecordInfo, StartedInfo)](
    runtime: Runtime | None,
    key: str | None,
    operation: str,
    kind: type[T],
    produce: Callable[[], T],
    args: BaseModel,
) -> T:
    """With a request key, do the work once per (runtime, key, operation) and answer every repeat
    of the same request with the first answer; the same key with another body is refused
    (IdempotencyKeyReused). Only successes are kept: a refused request wrote nothing and may be
    sent again."""
    if not key or runtime is None:
        return produce()
    fingerprint = request_fingerprint(args)
    nested = connection.in_atomic_block
    try:
        # No savepoint inside a caller's transaction: if a concurrent twin wins the unique key,
        # the whole request must be retried (the HTTP door does), not half of it kept.
        with transaction.atomic(savepoint=not nested):
            seen = ApiIdempotency.objects.filter(runtime=runtime, key=key, endpoint=operation).first()
            if seen is not None:
                return kind.from_json(_replayable(seen, fingerprint))
            try:
                result = produce()
            except StopRequested as exc:
                # The boundary's cancellation is the record: leave the block normally so that
                # it commits (an exception through it would roll it back), then refuse.
                refused = exc
            else:
                ApiIdempotency.objects.create(
                    runtime=runtime,
                    key=key,
                    endpoint=operation,
                    status=200,
                    body=result.to_json(),
                    fingerprint=fingerprint,
                )
                return result
    except IntegrityError:
        if nested:
            raise
        seen = ApiIdempotency.objects.get(runtime=runtime, key=key, endpoint=operation)
        return kind.from_json(_replayable(seen, fingerprint))
    raise refused


def request_fingerprint(args: BaseModel) -> str:
    """What was asked, independent of key order and of defaults spelled out or left off: the
    validated arguments, canonically serialised and hashed."""
    canonical = json.dumps(args.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replayable(seen: ApiIdempotency, fingerprint: str) -> Any:
    # Rows stored before fingerprints existed have none; they replay as they always did.
    if seen.fingerprint and seen.fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was already used for a different request; use a new key for new work.",
            field="Idempotency-Key",
        )
    return seen.body
