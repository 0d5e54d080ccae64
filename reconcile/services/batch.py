"""Reconciling many claimed items in one pass: the decisions of `item_reconcile`, with the database
work done set-based, so a stop over thousands of items costs a handful of statements rather than
ten round trips per item.

The pass, in order:
1. load every item (one query);
2. in slices of a few rounds of calls: record the slice's attempts (one INSERT), committed before
   any of its calls, and hand its calls to the pool, which makes them concurrently, outside any
   transaction (threads: the adapters are synchronous and share one connection pool per
   endpoint); while the pool works on that slice, the previous slice's answers are recorded
   (steps 3-4), so the database work overlaps the calls instead of following them;
3. record every answer of the slice on its attempt (one UPDATE);
4. let the engine decide each item on the state we read; record the tool calls each response
   launched itself, found in a final read-back, as its children (every response's calls in one
   transaction, before the responses move, as `item_apply` does); then apply the plans grouped: one
   `items_move` per (from, to, kind, outcome, message), which checks the from-state in its WHERE
   and writes each item's evidence and its audit event in the same statement, and one UPDATE for
   the items that only get a next check, again only where the state is still the one we read.

An item the groups cannot carry (a late result, a record to attach, a move the ledger does not
allow from the state we read), and any item whose state changed while its calls were out (a
worker or a person settled it meanwhile), goes through `item_apply`, the one-item path, which
reads it again and decides again: theirs stands.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from reconcile.mechanisms import registry
from reconcile.mechanisms.base import ItemRef, Mechanism, Observation
from reconcile.services.launched import responses_launched_record
from reconcile.services.reconcile import (
    ACTOR,
    Decision,
    Result,
    attempt_result,
    choose_action,
    decide,
    item_apply,
    observe,
)
from stopdesk.models import CancellationAttempt, WorkItem
from stopdesk.services.sql import is_postgres
from stopdesk.services.transitions import Row, Schedule, items_move, items_schedule
from stopdesk.states import SETTLED, TERMINAL, ItemState, can_move

log = logging.getLogger(__name__)
S = ItemState


@dataclass
class _Work:
    item: WorkItem
    mechanism: Mechanism
    action: str
    attempt_id: int = 0
    observation: Observation | None = None
    observed_at: datetime | None = None
    decision: Decision | None = None


def items_reconcile_batch(
    *,
    item_ids: list[int],
    concurrency: int,
    actor: str = ACTOR,
    now: datetime | None = None,
    release: Callable[[Iterable[int]], None] = lambda ids: None,
) -> list[Result]:
    """Reconcile items the caller has claimed, at most `concurrency` remote calls at once. `now`
    fixes the clock for every decision (tests); by default each item is decided at the moment its
    answer came back. `release` is told the items whose work is recorded (the caller's lease on
    them can end)."""
    items = list(WorkItem.objects.filter(pk__in=item_ids).order_by("pk"))
    results: list[Result] = []
    settled: list[int] = []
    work: list[_Work] = []
    for item in items:
        mechanism = registry.get(item.mechanism)
        if item.state in TERMINAL and item.state != S.CANCELLED:
            settled.append(item.pk)  # a worker settled it first: nothing to ask, only unschedule
            results.append(Result(item.pk, "none", "", item.state))
        else:
            work.append(_Work(item, mechanism, choose_action(item, mechanism)))
    if settled:
        WorkItem.objects.filter(pk__in=settled).update(next_check_at=None)
        release(settled)
    if not work:
        return results

    def call(w: _Work) -> None:
        w.observation = observe(w.mechanism, ItemRef.of(w.item), w.action)
        w.observed_at = now or timezone.now()

    # In slices, so the database work of one slice overlaps the calls of the next: a slice's
    # attempts are recorded (committed) before its calls are handed to the pool, and its answers
    # are recorded and applied while the pool works on the next slice's calls.
    size = max(64, 4 * concurrency)
    slices = [work[n : n + size] for n in range(0, len(work), size)]
    out: deque[tuple[list[_Work], list[Future[None]]]] = deque()
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(work))), thread_name_prefix="cancel") as pool:
        for part in slices:
            _attempts_open(part, now)
            out.append((part, [pool.submit(call, w) for w in part]))
            if len(out) > 1:
                results.extend(_answers_apply(*out.popleft(), actor=actor, release=release))
        while out:
            results.extend(_answers_apply(*out.popleft(), actor=actor, release=release))
    return results


def _answers_apply(
    part: list[_Work], calls: list[Future[None]], *, actor: str, release: Callable[[Iterable[int]], None]
) -> list[Result]:
    """Once a slice's calls are all back: its attempts closed, the engine's decisions, applied."""
    for future in calls:
        future.result()
    _attempts_close(part)
    for w in part:
        assert w.observation is not None and w.observed_at is not None
        w.decision = decide(
            item=w.item,
            mechanism=w.mechanism,
            observation=w.observation,
            now=w.observed_at,
            action=w.action,
            attempt_id=w.attempt_id,
        )
    results = _apply_all(part, actor)
    release(w.item.pk for w in part)
    return results


# --- applying the plans --------------------------------------------------------------------------


def _apply_all(work: list[_Work], actor: str) -> list[Result]:
    moves: dict[tuple[str, str, str, str, str, bool], dict[int, Row]] = defaultdict(dict)
    checks: dict[int, _Work] = {}
    one_by_one: list[_Work] = []
    by_id = {w.item.pk: w for w in work}
    for w in work:
        assert w.decision is not None and w.observation is not None
        plan, progress, evidence = w.decision.plan, w.decision.progress, w.decision.evidence
        state = w.item.state
        if plan.late_result is not None or w.observation.record is not None:
            one_by_one.append(w)
        elif plan.to_state in (S.COMPLETED, S.FAILED) and can_move(state, plan.to_state):
            # As item_finish then _schedule: the event carries what was seen, the item also keeps
            # its progress, and nothing is checked again.
            key = (state, plan.to_state, "transition", plan.outcome, plan.outcome, False)
            moves[key][w.item.pk] = Row(
                sets={"next_check_at": None},
                evidence={**evidence, "reconcile": progress},
                data={"evidence": evidence},
            )
        elif (
            plan.to_state is not None
            and can_move(state, plan.to_state)
            and plan.to_state not in (S.COMPLETED, S.FAILED)
        ):
            if plan.to_state == S.UNCERTAIN and plan.investigate_by is None:
                one_by_one.append(w)  # item_transition picks the default deadline
                continue
            # As item_transition: the item's evidence and the event's data are the same dict.
            full = {**evidence, "reconcile": progress}
            kind = "reconciled" if plan.to_state in SETTLED else "transition"
            with_deadline = plan.investigate_by is not None
            sets: dict[str, Any] = {"next_check_at": plan.next_check_at}
            if with_deadline:
                sets["investigate_by"] = plan.investigate_by
            key = (state, plan.to_state, kind, plan.outcome, plan.reason, with_deadline)
            moves[key][w.item.pk] = Row(sets=sets, evidence=full, data={"evidence": full})
        elif plan.to_state is None:
            checks[w.item.pk] = w
        else:
            one_by_one.append(w)  # not a move the ledger allows from here: item_apply says why

    alone = {w.item.pk for w in one_by_one}  # item_apply records their launched calls itself
    refused = _launched_record([w for w in work if w.item.pk not in alone], actor)
    if refused:
        for rows in moves.values():
            for item_id in refused & rows.keys():
                del rows[item_id]
        for item_id in refused & checks.keys():
            del checks[item_id]
        one_by_one.extend(by_id[item_id] for item_id in refused)

    results: list[Result] = []
    for (from_state, to_state, kind, outcome, message, _), rows in moves.items():
        if not rows:
            continue
        try:
            moved = items_move(
                where=Q(),
                from_states=(from_state,),
                to_state=to_state,
                actor=actor,
                kind=kind,
                message=message,
                sets={"outcome": outcome},
                rows=rows,
                return_ids=True,
            )
        except Exception:
            log.exception("moving %d item(s) %s -> %s failed; applying one by one", len(rows), from_state, to_state)
            moved = []
        assert isinstance(moved, list)
        for item_id in moved:
            w = by_id[item_id]
            results.append(Result(item_id, w.action, str(_seen(w)), to_state))
        one_by_one.extend(by_id[i] for i in set(rows) - set(moved))

    if checks:
        try:
            rescheduled = _schedule_many(checks)
        except Exception:
            log.exception("rescheduling %d item(s) failed; applying one by one", len(checks))
            rescheduled = set()
        for item_id in rescheduled:
            w = checks[item_id]
            results.append(Result(item_id, w.action, str(_seen(w)), w.item.state))
        one_by_one.extend(w for item_id, w in checks.items() if item_id not in rescheduled)

    for w in sorted(one_by_one, key=lambda w: w.item.pk):
        results.append(_apply_one(w, actor))
    return results


def _launched_record(work: list[_Work], actor: str) -> set[int]:
    """As `item_apply` does, before the responses' own moves: the tool calls each response launched
    itself, once its read-back is final, recorded as its children (set-based). Returns the items
    whose calls could not be recorded, for the one-item path, which records them again."""
    calls = {
        w.item.pk: w.observation.detail["tool_calls"]
        for w in work
        if w.observation is not None and w.observation.final and w.observation.detail.get("tool_calls")
    }
    if not calls:
        return set()
    try:
        responses_launched_record(calls=calls, actor=actor)
    except Exception:
        log.exception("recording the tool calls %d response(s) launched failed; applying one by one", len(calls))
        return set(calls)
    return set()


def _apply_one(w: _Work, actor: str) -> Result:
    assert w.observation is not None and w.observed_at is not None
    try:
        return item_apply(
            item_id=w.item.pk,
            mechanism=w.mechanism,
            observation=w.observation,
            actor=actor,
            now=w.observed_at,
            action=w.action,
            attempt_id=w.attempt_id,
        )
    except Exception:
        log.exception("reconciling item %s failed", w.item.pk)
        # Let it come back soon rather than wait for the batch's long claim to run out.
        WorkItem.objects.filter(pk=w.item.pk).update(next_check_at=timezone.now() + timedelta(seconds=60))
        return Result(w.item.pk, "error", "", "")


def _seen(w: _Work) -> str:
    return str(w.observation.seen) if w.observation is not None else ""


def _schedule_many(checks: dict[int, _Work]) -> set[int]:
    """Each item's next check and progress, where its state is still the one decided on."""
    plans = {}
    for item_id, w in checks.items():
        assert w.decision is not None
        plans[item_id] = Schedule(w.item.state, w.decision.plan.next_check_at, w.decision.progress)
    return items_schedule(plans)


# --- attempts --------------------------------------------------------------------------------------


def _attempts_open(work: list[_Work], now: datetime | None) -> None:
    """Record an attempt per item (one INSERT), before any of their calls is made."""
    sent_at = now or timezone.now()
    attempts = CancellationAttempt.objects.bulk_create(
        CancellationAttempt(item=w.item, mechanism=w.mechanism.name, action=w.action, sent_at=sent_at) for w in work
    )
    for w, attempt in zip(work, attempts, strict=True):
        w.attempt_id = attempt.pk


_CLOSE_SQL = """
UPDATE stopdesk_cancellationattempt a
SET answered_at = v.answered_at, ok = v.ok, observed_status = v.observed_status, detail = v.detail
FROM unnest(%s::bigint[], %s::timestamptz[], %s::boolean[], %s::text[], %s::jsonb[])
    AS v(id, answered_at, ok, observed_status, detail)
WHERE a.id = v.id
"""


def _attempts_close(work: list[_Work]) -> None:
    """Record every answer on its attempt in one statement (Django's bulk_update writes a CASE per
    column whose cost grows with the square of the row count)."""
    answers = [(w.attempt_id, w.observed_at, attempt_result(w.observation)) for w in work if w.observation]
    if is_postgres():
        detail_field = CancellationAttempt._meta.get_field("detail")
        params: list[Any] = [
            [a[0] for a in answers],
            [a[1] for a in answers],
            [a[2]["ok"] for a in answers],
            [a[2]["observed_status"] for a in answers],
            [detail_field.get_db_prep_save(a[2]["detail"], connection) for a in answers],
        ]
        with connection.cursor() as cursor:
            cursor.execute(_CLOSE_SQL, params)
        return
    with transaction.atomic():
        for attempt_id, answered_at, columns in answers:
            CancellationAttempt.objects.filter(pk=attempt_id).update(answered_at=answered_at, **columns)
