"""Digests: a task's per-item facts (items uncertain, late results, deadlines) reach a subscriber
as few messages with counts and a link, not one message per item.

A digest opens with its task's first such fact (notify/gather.py). The beat sweep writes its
first message once the window has passed, then the follow-up when every item of the task has
settled (for a stopped task: when the stop has settled), and closes it; while the task has not
settled, at most one update per repeat interval, and only when there are new facts. A later fact
opens a new digest.

Each message is an outbox row like any other (same delivery, signing, retries and webhook-id),
written in the transaction that moves the digest's cursor, so a message and the facts it counts
are recorded together: a crash before commit writes neither, a re-delivery repeats the same
counts under the same webhook-id, and the next message counts only the facts after the cursor.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone

from stopdesk.models import Task, WorkItem
from stopdesk.notify.gather import digest_window
from stopdesk.notify.models import Digest, Notification
from stopdesk.notify.outbox import notifications_write
from stopdesk.notify.topics import Topic
from stopdesk.states import UNSETTLED, ItemState

# How soon an open digest is looked at again (the sweep runs every 10 s).
RECHECK = timedelta(seconds=10)
# How long the sweep waits for the transactions filing facts into a digest.
LOCK_WAIT = timedelta(seconds=5)
LOCK_NOT_AVAILABLE = "55P03"
SWEEP_BUDGET = timedelta(seconds=60)
# Plural phrases of each gathered fact, in the order a message lists them.
FACT_WORDS = {
    Topic.ITEM_UNCERTAIN: ("item became uncertain", "items became uncertain"),
    Topic.LATE_RESULT: ("late result contradicts a recorded outcome", "late results contradict recorded outcomes"),
    Topic.INVESTIGATE_PASSED: ("investigate-by deadline passed", "investigate-by deadlines passed"),
    Topic.INVESTIGATE_NEAR: ("investigate-by deadline is near", "investigate-by deadlines are near"),
}


def digest_repeat() -> timedelta:
    """The least time between two updates of a task that has not settled."""
    notify: dict[str, Any] = settings.STOPDESK_NOTIFY
    return timedelta(minutes=float(notify.get("DIGEST_REPEAT_MINUTES", 30)))


def digests_send(*, now: datetime | None = None, limit: int = 200) -> int:
    """One pass of the sweep over the digests that are due; returns how many messages it wrote."""
    now = now or timezone.now()
    due = Digest.objects.filter(closed_at__isnull=True, due_at__lte=now).order_by("due_at")
    written = 0
    # Within the sweep job's time limit even if several digests each make it wait LOCK_WAIT.
    budget = time.monotonic() + SWEEP_BUDGET.total_seconds()
    for digest_id in list(due.values_list("id", flat=True)[:limit]):
        if time.monotonic() > budget:
            break  # the rest are still due at the next sweep
        written += digest_step(digest_id, now=now)
    return written


def digest_step(digest_id: int, *, now: datetime) -> int:
    """Look at one digest: write its next message if one is due, close it once its task settled.
    Returns 1 if it wrote a message, 0 if not (or if it is left to the next sweep)."""
    try:
        return _step(digest_id, now=now)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        return 0  # facts kept being filed for LOCK_WAIT: the next sweep tries again


def _step(digest_id: int, *, now: datetime) -> int:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Shared locks can keep an exclusive one waiting while they overlap; a busy task's
            # digest must not hold up the sweep's other work.
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{int(LOCK_WAIT.total_seconds() * 1000)}ms'")
        # FOR UPDATE waits for every transaction still filing a fact here (they hold KEY SHARE),
        # and holds back new ones until this commits: what is counted below is all there is.
        digest = (
            Digest.objects.select_for_update().filter(pk=digest_id, closed_at__isnull=True, due_at__lte=now).first()
        )
        if digest is None:
            return 0  # another sweep took it, or it is not due any more
        facts = Notification.objects.filter(digest=digest)
        new = _counts(facts.filter(id__gt=digest.counted_through))
        if not new and digest.messages == 0:
            # Its only facts were repeats that the outbox skipped: nothing to say.
            Digest.objects.filter(pk=digest.pk).update(closed_at=now)
            return 0
        states = dict(
            WorkItem.objects.filter(task_id=digest.task_id).values_list("state").annotate(n=Count("id")).order_by()
        )
        settled = not any(states.get(s, 0) for s in UNSETTLED)
        repeat_due = digest.last_message_at is None or now >= digest.last_message_at + digest_repeat()
        if not (digest.messages == 0 or settled or (new and repeat_due)):
            Digest.objects.filter(pk=digest.pk).update(due_at=now + RECHECK)
            return 0
        through = max((top for _, top in new.values()), default=digest.counted_through)
        total = _counts(facts.filter(id__lte=through))
        message = _message(digest, new=new, total=total, states=states, settled=settled)
        notifications_write([message])
        Digest.objects.filter(pk=digest.pk).update(
            messages=digest.messages + 1,
            counted_through=through,
            last_message_at=now,
            due_at=now + RECHECK,
            closed_at=now if settled else None,
        )
    return 1


def _counts(facts: Any) -> dict[str, tuple[int, int]]:
    """Per topic: how many facts, and the highest id among them."""
    rows = facts.values_list("topic").annotate(n=Count("id"), top=Max("id")).order_by()
    return {topic: (n, top) for topic, n, top in rows}


def _facts_phrase(counts: dict[str, int]) -> str:
    parts = []
    for topic, (one, many) in FACT_WORDS.items():
        n = counts.get(topic, 0)
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    return ", ".join(parts) or "nothing new"


def _states_phrase(states: dict[str, int]) -> str:
    labels = dict(ItemState.choices)
    ordered = sorted(states.items(), key=lambda pair: (-pair[1], pair[0]))
    return ", ".join(f"{n} {str(labels.get(state, state)).lower()}" for state, n in ordered if n)


def _message(
    digest: Digest,
    *,
    new: dict[str, tuple[int, int]],
    total: dict[str, tuple[int, int]],
    states: dict[str, int],
    settled: bool,
) -> Notification:
    task = Task.objects.filter(pk=digest.task_id).only("title", "stop_requested_at").first()
    stopped = task is not None and task.stop_requested_at is not None
    name = repr(task.title) if task else f"#{digest.task_id}"
    new_n = {topic: n for topic, (n, _) in new.items()}
    total_n = {topic: n for topic, (n, _) in total.items()}
    unsettled = sum(states.get(s, 0) for s in UNSETTLED)
    head = f"Stop of task {name}" if stopped else f"Task {name}"
    if settled:
        head += " has settled" if stopped else " has nothing running or queued"
    title = f"{head}: {_facts_phrase(total_n)}"
    if not settled:
        title += f"; {unsettled} still running or queued"
    earliest = (
        WorkItem.objects.filter(task_id=digest.task_id, state=ItemState.UNCERTAIN)
        .aggregate(at=Min("investigate_by"))
        .get("at")
    )
    base = str(settings.STOPDESK_NOTIFY["BASE_URL"]).rstrip("/")
    sequence = digest.messages + 1
    since = "Since the last message" if sequence > 1 else f"In the first {_minutes(digest_window())}"
    lines = [
        title + ".",
        f"{since}: {_facts_phrase(new_n)}.",
        f"Items now: {_states_phrase(states) or 'none'}.",
        f"Earliest investigate-by: {earliest:%Y-%m-%d %H:%M} UTC." if earliest else "",
        f"Task: {base}/tasks/{digest.task_id}/",
        f"Review queue: {base}/queue/",
    ]
    return Notification(
        topic=Topic.TASK_DIGEST,
        dedupe_key=f"digest:{digest.pk}:{sequence}",
        task_id=digest.task_id,
        title=title[:300],
        body="\n".join(line for line in lines if line),
        data={
            "task_id": digest.task_id,
            "digest_id": digest.pk,
            "sequence": sequence,
            "stopped": stopped,
            "settled": settled,
            # Which topics it gathers (whom it goes to), the facts since the previous message of
            # this digest (they add up to `total`), and the task's items by state now.
            "topics": sorted(total_n),
            "new": new_n,
            "total": total_n,
            "items": states,
            "investigate_by": earliest.isoformat() if earliest else None,
            "url": f"{base}/tasks/{digest.task_id}/",
        },
        created_at=timezone.now(),
    )


def _minutes(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"
