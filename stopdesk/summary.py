"""The plain-language account of a task: counts in words, the items' own nouns, and never more
than the ledger knows.

Every phrase follows an item's *latest known* outcome, not only its recorded state:

| Recorded state | Later report (late result) | Counted as                                            |
|----------------|----------------------------|-------------------------------------------------------|
| completed      | —                          | completed (by its effect where it changed a system)   |
| cancelled      | completed                  | completed; review required (never "discarded")        |
| completed      | cancelled or failed        | completed; review required (an effect may exist)      |
| cancelled      | failed                     | failed; review required                               |
| failed         | completed                  | completed; review required                            |
| cancelled, never started, model request | — | discarded                                          |
| cancelled, never started, other kinds   | — | cancelled before it started                         |
| cancelled after it started, model request | — | discarded                                        |
| cancelled after it started, other kinds | — | stopped before it finished                          |
| uncertain      | —                          | unknown outcome; review required                      |
| queued, running, awaiting reconciliation | — | still being checked (after Stop) / running       |

Completed wins a contradiction: of two reports, the one that may have changed another system is
the one a person must look at. "Nothing was left to stop" is said only when Stop found no item to
cancel and none in flight to reconcile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q
from django.db.models.fields.json import KT

from stopdesk.models import ExternalRecord, Task, WorkItem, pluralize
from stopdesk.states import UNSETTLED, ItemState, Kind

S = ItemState
_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def number_word(n: int) -> str:
    return _WORDS[n] if n < len(_WORDS) else str(n)


@dataclass(frozen=True)
class _Group:
    noun: str
    plural: str

    def count(self, n: int) -> str:
        words = number_word(n)
        return f"{words[0].upper()}{words[1:]} {self.noun if n == 1 else self.plural}"


def latest_outcome(state: str, reported: str | None) -> str:
    """An item's latest known outcome from its recorded state and a later contradicting report."""
    if not reported or reported == state:
        return state
    if S.COMPLETED in (state, reported):
        return S.COMPLETED
    return reported


def task_summary(task: Task) -> str:
    """One paragraph. A constant number of queries, whatever the number of items."""
    reported = KT("evidence__late_result__reported")
    rows = (
        WorkItem.objects.filter(task=task)
        .annotate(reported=reported)
        .values("state", "reported", "noun", "noun_plural", "kind")
        .annotate(
            n=Count("id"),
            started=Count("id", filter=Q(started_at__isnull=False)),
            reconciled=Count("id", filter=Q(cancel_requested_at__isnull=False)),
        )
        .order_by("state", "noun")
    )
    completed = Q(item__state=S.COMPLETED) | Q(item__evidence__late_result__reported=S.COMPLETED)
    # Latest outcome completed, and a report contradicts the record (either way round).
    contradicted = ~Q(item__state=S.COMPLETED) | Q(item__evidence__late_result__reported__in=[S.FAILED, S.CANCELLED])
    effects = (
        ExternalRecord.objects.filter(completed, item__task=task)
        .values("item__noun", "item__noun_plural", "effect", "reversible")
        .annotate(n=Count("item", distinct=True), late=Count("item", distinct=True, filter=contradicted))
        .order_by("item__noun", "effect")
    )
    return compose(
        [dict(r) for r in rows], [dict(e) for e in effects], stopped=task.is_stopped, closed=task.closed_at is not None
    )


def compose(rows: list[dict[str, Any]], effects: list[dict[str, Any]], *, stopped: bool, closed: bool = True) -> str:
    """rows: per (state, reported, noun, kind): n items, of which `started` had started and
    `reconciled` were in flight when Stop came. effects: per (noun, effect, reversible) of items
    whose latest outcome is completed: n items, of which `late` were recorded otherwise first."""
    by_outcome: dict[str, Counter[_Group]] = {s: Counter() for s in S.values}
    discarded: Counter[_Group] = Counter()
    never_started: Counter[_Group] = Counter()
    late: dict[str, Counter[_Group]] = {S.COMPLETED: Counter(), S.FAILED: Counter(), S.CANCELLED: Counter()}
    reconciled = 0
    crossed = 0
    for row in rows:
        group = _Group(row["noun"], row["noun_plural"] or pluralize(row["noun"]))
        n, started = row["n"], row.get("started", row["n"])
        reconciled += row.get("reconciled", 0)
        reported = row.get("reported")
        outcome = latest_outcome(row["state"], reported)
        if reported and reported != row["state"] and outcome in late:
            late[outcome][group] += n
            if row["state"] == S.CANCELLED:
                # Recorded cancelled (by Stop or the boundary), yet it ran: Stop met work in flight.
                crossed += n
        elif outcome == S.CANCELLED and row["kind"] == Kind.MODEL_REQUEST:
            discarded[group] += n
        elif outcome == S.CANCELLED:
            never_started[group] += n - started
            by_outcome[S.CANCELLED][group] += started
        else:
            by_outcome[outcome][group] += n

    sentences: list[str] = []
    total = sum(r["n"] for r in rows)
    unsettled = sum(by_outcome[s].total() for s in UNSETTLED)
    if stopped:
        had_work = (
            reconciled
            + discarded.total()
            + never_started.total()
            + by_outcome[S.CANCELLED].total()
            + late[S.CANCELLED].total()
            + unsettled
            + by_outcome[S.UNCERTAIN].total()
            + crossed
        )
        sentences.append("Stopped new work." if had_work else "Stop requested; nothing was left to stop.")
    elif total == 0:
        return "No work recorded yet."
    elif unsettled:
        done = total - unsettled
        sentences.append(f"Running: {done} of {total} {'item' if total == 1 else 'items'} finished.")
    elif not closed:
        # Settled is not over: an open task can get new work at any moment (services/closing.py).
        sentences.append("Every item so far has finished; the task is still open.")
    else:
        sentences.append("Finished.")

    def say(counter: Counter[_Group], singular: str, plural: str) -> None:
        for group, n in counter.items():
            if n > 0:
                sentences.append(f"{group.count(n)} {singular if n == 1 else plural}.")

    say(discarded, "discarded", "discarded")
    say(never_started, "cancelled before it started", "cancelled before they started")
    say(by_outcome[S.CANCELLED], "stopped before it finished", "stopped before they finished")

    # Completed work, told by its effect where it had one in another system.
    with_effect: Counter[_Group] = Counter()
    late_with_effect: Counter[_Group] = Counter()
    for eff in effects:
        group = _Group(eff["item__noun"], eff["item__noun_plural"] or pluralize(eff["item__noun"]))
        n, n_late = eff["n"], eff.get("late", 0)
        with_effect[group] += n - n_late
        late_with_effect[group] += n_late
        they = "it" if n == 1 else "they"
        if eff["reversible"]:
            tail = "; review required." if stopped or n_late else "."
        elif eff["effect"] == "sent":
            tail = f"; {they} cannot be recalled{'; review required' if n_late else ''}."
        else:
            tail = f"; {they} cannot be undone{'; review required' if n_late else ''}."
        sentences.append(f"{group.count(n)} {eff['effect']}{tail}")
    for group, n in by_outcome[S.COMPLETED].items():
        rest = n - with_effect[group]
        if rest > 0:
            sentences.append(f"{group.count(rest)} completed.")
    contradicted = "; a late report contradicts its record: review required"
    contradicted_many = "; late reports contradict their records: review required"
    for group, n in late[S.COMPLETED].items():
        rest = n - late_with_effect[group]
        if rest > 0:
            sentences.append(f"{group.count(rest)} completed{contradicted if rest == 1 else contradicted_many}.")

    say(by_outcome[S.FAILED], "failed", "failed")
    say(late[S.FAILED], "failed" + contradicted, "failed" + contradicted_many)
    say(late[S.CANCELLED], "stopped" + contradicted, "stopped" + contradicted_many)
    if stopped:
        for state in (S.RUNNING, S.AWAITING_RECONCILIATION, S.QUEUED):
            say(by_outcome[state], "still being checked", "still being checked")
    say(by_outcome[S.UNCERTAIN], "with unknown outcome; review required", "with unknown outcome; review required")
    return " ".join(sentences)
