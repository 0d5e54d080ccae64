"""The plain-language account of a task: counts in words, the items' own nouns, and never
"cancelled" for work that completed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models import Count

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


def task_summary(task: Task) -> str:
    """One paragraph. A constant number of queries, whatever the number of items."""
    rows = (
        WorkItem.objects.filter(task=task)
        .values("state", "noun", "noun_plural", "kind")
        .annotate(n=Count("id"))
        .order_by("state", "noun")
    )
    effects = (
        ExternalRecord.objects.filter(item__task=task, item__state=S.COMPLETED)
        .values("item__noun", "item__noun_plural", "effect", "reversible")
        .annotate(n=Count("item", distinct=True))
        .order_by("item__noun", "effect")
    )
    return compose([dict(r) for r in rows], [dict(e) for e in effects], stopped=task.is_stopped)


def compose(rows: list[dict], effects: list[dict], *, stopped: bool) -> str:  # type: ignore[type-arg]
    by_state: dict[str, Counter[_Group]] = {s: Counter() for s in S.values}
    discarded: Counter[_Group] = Counter()
    for row in rows:
        group = _Group(row["noun"], row["noun_plural"] or pluralize(row["noun"]))
        if row["state"] == S.CANCELLED and row["kind"] == Kind.MODEL_REQUEST:
            discarded[group] += row["n"]
        else:
            by_state[row["state"]][group] += row["n"]

    sentences: list[str] = []
    total = sum(r["n"] for r in rows)
    unsettled = sum(by_state[s].total() for s in UNSETTLED)
    if stopped:
        had_work = discarded.total() + by_state[S.CANCELLED].total() + unsettled + by_state[S.UNCERTAIN].total()
        sentences.append("Stopped new work." if had_work else "Stop requested; nothing was left to stop.")
    elif total == 0:
        return "No work recorded yet."
    elif unsettled:
        done = total - unsettled
        sentences.append(f"Running: {done} of {total} {'item' if total == 1 else 'items'} finished.")
    else:
        sentences.append("Finished.")

    for group, n in discarded.items():
        sentences.append(f"{group.count(n)} discarded.")
    for group, n in by_state[S.CANCELLED].items():
        sentences.append(f"{group.count(n)} stopped before {'it' if n == 1 else 'they'} finished.")

    # Completed work, told by its effect where it had one in another system.
    with_effect: Counter[_Group] = Counter()
    for eff in effects:
        group = _Group(eff["item__noun"], eff["item__noun_plural"] or pluralize(eff["item__noun"]))
        n = eff["n"]
        with_effect[group] += n
        if eff["reversible"]:
            tail = "; review required." if stopped else "."
        else:
            tail = (
                f"; {'it' if n == 1 else 'they'} cannot be recalled."
                if eff["effect"] == "sent"
                else "; it cannot be undone."
                if n == 1
                else "; they cannot be undone."
            )
        sentences.append(f"{group.count(n)} {eff['effect']}{tail}")
    for group, n in by_state[S.COMPLETED].items():
        rest = n - with_effect[group]
        if rest > 0:
            sentences.append(f"{group.count(rest)} completed.")

    for group, n in by_state[S.FAILED].items():
        sentences.append(f"{group.count(n)} failed.")
    if stopped:
        for state in (S.RUNNING, S.AWAITING_RECONCILIATION, S.QUEUED):
            for group, n in by_state[state].items():
                sentences.append(f"{group.count(n)} still being checked.")
    for group, n in by_state[S.UNCERTAIN].items():
        sentences.append(f"{group.count(n)} with unknown outcome; review required.")
    return " ".join(sentences)
