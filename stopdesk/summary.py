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
| cancelled, never started, a function call a response left | — | never ran                           |
| cancelled, a call registered as asked for, never run      | — | never ran                           |
| cancelled after it started, model request | — | discarded                                        |
| cancelled after it started, other kinds | — | stopped before it finished                          |
| uncertain      | —                          | unknown outcome; review required                      |
| queued, running, awaiting reconciliation | — | still being checked (after Stop) / running       |
| running or awaiting, noted uninterruptible | — | still running: it cannot be interrupted        |

A tool body that Stop cannot interrupt (a plain function in a thread) is noted so while it runs on
(`evidence.uninterruptible`), and is then told by what it did: never "stopped" unless it stopped.

Completed wins a contradiction: of two reports, the one that may have changed another system is
the one a person must look at. "Nothing was left to stop" is said only when Stop found no item to
cancel and none in flight to reconcile.

What needs a person comes first, right after the opening sentence: unknown outcomes, then
contradicting reports, then effects waiting for a reversal decision. "Review required" is said of
exactly the items `stopdesk.review_state.needs_review` selects, the definition the task list's tag
and filter use too; a record already reversed is told with its compensation ("One record
created, then archived by compensation #2.") and no longer asks for review.

Completed work an item says how to tell (`detail["tool"]["told"]`: a noun, its plural and a verb,
as a coding agent's tool uses carry them) is told so: "Two files edited.", "One command ran.".

An effect is told by its item's `detail["effect"]` where it has one (a hosted tool's call that
sent an email: "One email sent by a hosted tool", "... after Stop"), otherwise by the item's noun.

Numbers: words from zero to ten, digits from 11 on, everywhere in the summary. Completed work
without an effect is called "completed with no effect recorded" when effects of the same noun
are told beside it, so "Five emails sent." and "Two emails completed." never read as two counts
of the same emails.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Min, OuterRef, Q, Subquery
from django.db.models.fields.json import KT, KeyTextTransform, KeyTransform

from reconcile.models import Compensation
from stopdesk.models import ExternalRecord, Task, WorkItem, pluralize
from stopdesk.review_state import needs_review
from stopdesk.states import CompensationState, ItemState, Kind

S = ItemState
C = CompensationState
_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
REVIEW = "review required"


def number_word(n: int) -> str:
    """Words from zero to ten, digits from 11 on: the summary's one number style."""
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


@dataclass(frozen=True)
class _Group:
    noun: str
    plural: str

    def count(self, n: int) -> str:
        words = number_word(n)
        return f"{words[0].upper()}{words[1:]} {self.noun if n == 1 else self.plural}"


@dataclass(frozen=True)
class _Phrase:
    """What a sentence says of its items, after "<Number> <noun>"."""

    singular: str
    plural: str
    order: int  # the place among sentences of the same kind (needing review or not)

    def of(self, n: int, *, review: bool) -> str:
        text = self.singular if n == 1 else self.plural
        return f"{text}; {REVIEW}" if review and REVIEW not in text else text


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
        .annotate(
            reported=reported,
            told_noun=KT("detail__tool__told__noun"),
            told_nouns=KT("detail__tool__told__nouns"),
            told_done=KT("detail__tool__told__done"),
        )
        .values("state", "reported", "noun", "noun_plural", "kind", "told_noun", "told_nouns", "told_done")
        .annotate(
            n=Count("id"),
            started=Count("id", filter=Q(started_at__isnull=False)),
            reconciled=Count("id", filter=Q(cancel_requested_at__isnull=False)),
            review=Count("id", filter=needs_review(task=task)),
            # A function call a cancelled response left for the application (reconcile/services/launched.py).
            never_ran=Count("id", filter=Q(started_at__isnull=True, detail__launched__type="function_call")),
            # A call registered as the model asked for it that the agent never ran (frameworks/core.py).
            never_ran_started=Count("id", filter=Q(started_at__isnull=False, evidence__has_key="never_ran")),
            uninterruptible=Count("id", filter=Q(evidence__has_key="uninterruptible")),
        )
        .order_by("state", "noun")
    )
    completed = Q(item__state=S.COMPLETED) | Q(item__evidence__late_result__reported=S.COMPLETED)
    # Latest outcome completed, and a report contradicts the record (either way round).
    contradicted = ~Q(item__state=S.COMPLETED) | Q(item__evidence__late_result__reported__in=[S.FAILED, S.CANCELLED])
    # The record's latest compensation that is not a dead end (rejected or failed ones leave the
    # record as if none had been proposed).
    latest = (
        Compensation.objects.filter(external_record=OuterRef("pk"))
        .exclude(state__in=(C.REJECTED, C.FAILED))
        .order_by("-id")
    )
    effects = (
        ExternalRecord.objects.filter(completed, item__task=task)
        .annotate(
            # How an effect is told when its item says so (a hosted tool's call: "email", "by a
            # hosted tool"); otherwise by the item's own noun.
            told_noun=_told("noun"),
            told_nouns=_told("nouns"),
            told_by=_told("by"),
            followup=Subquery(latest.values("state")[:1]),
            action=Subquery(latest.values("action")[:1]),
            compensation_id=Subquery(latest.values("id")[:1]),
        )
        .values(
            "item__noun",
            "item__noun_plural",
            "told_noun",
            "told_nouns",
            "told_by",
            "effect",
            "reversible",
            "followup",
            "action",
        )
        .annotate(
            n=Count("item", distinct=True),
            late=Count("item", distinct=True, filter=contradicted),
            review=Count("item", distinct=True, filter=needs_review("item__", task=task)),
            late_review=Count("item", distinct=True, filter=contradicted & needs_review("item__", task=task)),
            compensation=Min("compensation_id"),
        )
        .order_by("item__noun", "effect", "followup")
    )
    return compose(
        [dict(r) for r in rows], [dict(e) for e in effects], stopped=task.is_stopped, closed=task.closed_at is not None
    )


def _told(key: str) -> KeyTextTransform:
    """For ExternalRecord rows: the text at `key` of their item's `detail["effect"]`."""
    return KeyTextTransform(key, KeyTransform("effect", "item__detail"))


def past_tense(action: str) -> str:
    """A compensation's action as done: "archive" → "archived", "report_only" → "reported as is"."""
    if action == "report_only":
        return "reported as is"
    words = str(action or "reverse").replace("_", " ")
    return words + ("d" if words.endswith("e") else "ed")


def _effect_phrase(eff: dict[str, Any]) -> tuple[str, str]:
    """(singular, plural) for completed work told by its effect in another system, with what
    became of it since: a reversal under way, done, or waiting for an approver."""
    followup, number = eff.get("followup") or "", eff.get("compensation")
    effect = f"{eff['effect']} by {eff['told_by']}" if eff.get("told_by") else eff["effect"]
    by = f"compensation #{number}" if number else "compensation"
    if followup == C.DONE:
        past = past_tense(eff.get("action") or "")
        return f"{effect}, then {past} by {by}", f"{effect}, then {past} by compensations"
    if followup in (C.APPROVED, C.RUNNING):
        return f"{effect}; its reversal is under way ({by})", f"{effect}; their reversals are under way"
    if followup == C.ESCALATED:
        return f"{effect}; its reversal is escalated", f"{effect}; their reversals are escalated"
    if followup == C.PROPOSED:
        return f"{effect}; its reversal waits for approval", f"{effect}; their reversals wait for approval"
    if eff["reversible"]:
        return effect, effect
    if eff["effect"] == "sent":
        return f"{effect}; it cannot be recalled", f"{effect}; they cannot be recalled"
    return f"{effect}; it cannot be undone", f"{effect}; they cannot be undone"


# Sentence kinds, in the order they are told (needing a person first, then the rest).
UNKNOWN = _Phrase("with unknown outcome; review required", "with unknown outcome; review required", 0)
_CONTRADICTS = "; a late report contradicts its record: review required"
_CONTRADICT = "; late reports contradict their records: review required"
_CONTRADICTED = "; a late report contradicted its record, reviewed"
_CONTRADICTED_MANY = "; late reports contradicted their records, reviewed"
DISCARDED = _Phrase("discarded", "discarded", 10)
NEVER_STARTED = _Phrase("cancelled before it started", "cancelled before they started", 11)
NEVER_RAN = _Phrase("never ran", "never ran", 11)
STOPPED_EARLY = _Phrase("stopped before it finished", "stopped before they finished", 12)
EFFECT_ORDER = 20
COMPLETED = _Phrase("completed", "completed", 30)
COMPLETED_BESIDE_EFFECTS = _Phrase("completed with no effect recorded", "completed with no effect recorded", 30)
FAILED = _Phrase("failed", "failed", 40)
CHECKING = _Phrase("still being checked", "still being checked", 60)
STILL_RUNNING = _Phrase(
    "still running: it cannot be interrupted; waiting for it to finish",
    "still running: they cannot be interrupted; waiting for them to finish",
    59,
)


def _late(outcome: str, *, review: bool) -> _Phrase:
    verb = "stopped" if outcome == S.CANCELLED else outcome
    one, many = (_CONTRADICTS, _CONTRADICT) if review else (_CONTRADICTED, _CONTRADICTED_MANY)
    order = {str(S.COMPLETED): 31, str(S.FAILED): 41, str(S.CANCELLED): 42}[outcome]
    return _Phrase(verb + one, verb + many, order)


def compose(rows: list[dict[str, Any]], effects: list[dict[str, Any]], *, stopped: bool, closed: bool = True) -> str:
    """rows: per (state, reported, noun, kind): n items, of which `started` had started,
    `reconciled` were in flight when Stop came, `review` need a person and `uninterruptible` run
    on where Stop could not interrupt them. effects: per (noun,
    effect, reversible, followup, action) of items whose latest outcome is completed: n items, of
    which `late` were recorded otherwise first and `review` need a person; `compensation` names
    the record's compensation where there is one."""
    told: Counter[tuple[_Phrase, _Group, bool]] = Counter()
    unsettled_by: dict[_Group, list[int]] = {}  # before Stop these are told as progress
    reconciled = crossed = discarded = cancelled = uncertain = outliving = 0
    # Completed items of a group, and how many of them an effect sentence tells.
    completed_left: Counter[tuple[_Group, bool, bool]] = Counter()  # (group, late, review)
    for row in rows:
        group = _Group(row["noun"], row["noun_plural"] or pluralize(row["noun"]))
        n, started = row["n"], row.get("started", row["n"])
        review = min(row.get("review", 0), n)
        reconciled += row.get("reconciled", 0)
        reported = row.get("reported")
        outcome = latest_outcome(row["state"], reported)
        is_late = bool(reported and reported != row["state"])

        def tell(phrase: _Phrase, count: int, review_count: int, *, group: _Group = group) -> None:
            told[(phrase, group, True)] += review_count
            told[(phrase, group, False)] += count - review_count

        if outcome == S.COMPLETED and not is_late and row.get("told_done"):
            # Told by what it did ("Two files edited."), as the item says; it has no record elsewhere.
            noun = row.get("told_noun") or row["noun"]
            told_as = _Group(noun, row.get("told_nouns") or pluralize(noun))
            done = str(row["told_done"])
            tell(_Phrase(done, done, COMPLETED.order), n, review, group=told_as)
            continue
        if is_late and row["state"] == S.CANCELLED:
            crossed += n  # recorded cancelled (by Stop or the boundary), yet it ran: Stop met it in flight
        if outcome == S.COMPLETED:
            completed_left[(group, is_late, True)] += review
            completed_left[(group, is_late, False)] += n - review
        elif is_late:
            told[(_late(outcome, review=True), group, True)] += review
            told[(_late(outcome, review=False), group, False)] += n - review
            cancelled += n if outcome == S.CANCELLED else 0
        elif outcome == S.CANCELLED and row["kind"] == Kind.MODEL_REQUEST:
            tell(DISCARDED, n, review)
            discarded += n
        elif outcome == S.CANCELLED:
            # Which of them had started is not split by review: a flag on a cancelled item is rare.
            never_ran = min(row.get("never_ran", 0), n - started)
            asked_only = min(row.get("never_ran_started", 0), started)
            left = review
            for phrase, count in (
                (NEVER_STARTED, n - started - never_ran),
                (STOPPED_EARLY, started - asked_only),
                (NEVER_RAN, never_ran + asked_only),
            ):
                tell(phrase, count, min(left, count))
                left -= min(left, count)
            cancelled += n
        elif outcome == S.UNCERTAIN:
            tell(UNKNOWN, n, n)
            uncertain += n
        elif outcome == S.FAILED:
            tell(FAILED, n, review)
        else:
            # Not flagged for review in practice (a running item); any that is stays with CHECKING.
            running_on = min(row.get("uninterruptible", 0), n - review)
            told[(STILL_RUNNING, group, False)] += running_on
            outliving += running_on
            unsettled_by.setdefault(group, [0, 0])
            unsettled_by[group][0] += n - running_on
            unsettled_by[group][1] += review

    # Completed work, told by its effect where it had one in another system.
    with_effect: set[_Group] = set()
    for eff in effects:
        group = _Group(eff["item__noun"], eff["item__noun_plural"] or pluralize(eff["item__noun"]))
        told_as = (
            _Group(eff["told_noun"], eff.get("told_nouns") or pluralize(eff["told_noun"]))
            if eff.get("told_noun")
            else group
        )
        n, n_late = eff["n"], eff.get("late", 0)
        review = min(eff.get("review", 0), n)
        with_effect.add(told_as)
        one, many = _effect_phrase(eff)
        # Which late ones need a person is counted, not assumed: an acknowledged late report sits
        # beside a record flagged for another reason (one record shared by two items).
        late_review = min(eff.get("late_review", min(n_late, review)), n_late, review)
        for is_late, count, count_review in ((True, n_late, late_review), (False, n - n_late, review - late_review)):
            for needs, k in ((True, count_review), (False, count - count_review)):
                if k <= 0:
                    continue
                if is_late:
                    tail_one, tail_many = (_CONTRADICTS, _CONTRADICT) if needs else (_CONTRADICTED, _CONTRADICTED_MANY)
                else:
                    tail_one = tail_many = ""
                told[(_Phrase(one + tail_one, many + tail_many, EFFECT_ORDER), told_as, needs)] += k
                completed_left[(group, is_late, needs)] -= k
    for (group, is_late, review), n in completed_left.items():
        if n <= 0:
            continue
        if is_late:
            told[(_late(S.COMPLETED, review=review), group, review)] += n
        else:
            told[(COMPLETED_BESIDE_EFFECTS if group in with_effect else COMPLETED, group, review)] += n

    total = sum(r["n"] for r in rows)
    unsettled = sum(n for n, _ in unsettled_by.values()) + outliving
    if stopped:
        had_work = reconciled + discarded + cancelled + unsettled + uncertain + crossed
        head = "Stopped new work." if had_work else "Stop requested; nothing was left to stop."
        for group, (n, review) in unsettled_by.items():
            told[(CHECKING, group, True)] += review
            told[(CHECKING, group, False)] += n - review
    elif total == 0:
        return "No work recorded yet."
    elif unsettled:
        items = "item" if total == 1 else "items"
        head = f"Running: {number_word(total - unsettled)} of {number_word(total)} {items} finished."
        # Running work that already needs a person (a flagged item) is still told.
        for group, (_, review) in unsettled_by.items():
            told[(CHECKING, group, True)] += review
    elif not closed:
        # Settled is not over: an open task can get new work at any moment (services/closing.py).
        head = "Every item so far has finished; the task is still open."
    else:
        head = "Finished."

    sentences = [head]
    for review in (True, False):
        chosen = [(phrase, group, n) for (phrase, group, r), n in told.items() if r == review and n > 0]
        chosen.sort(key=lambda c: c[0].order)  # stable: groups keep the order they were read in
        for phrase, group, n in chosen:
            sentences.append(f"{group.count(n)} {phrase.of(n, review=review)}.")
    return " ".join(sentences)
