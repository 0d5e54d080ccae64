"""The summary as a property: for any ledger (every state, late results, records with each effect
and reversibility, nouns, one or many), no item whose latest outcome is completed is counted as
discarded or cancelled, the counts add up to the items, and each sentence's number matches the
items it names. compose() is the summary's pure core; task_summary feeds it from two aggregates,
which tests/ledger/test_summary.py exercises through the services."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from stopdesk.states import Effect, ItemState, Kind
from stopdesk.summary import _WORDS, compose, latest_outcome

S = ItemState
NOUNS = {"draft": "drafts", "query": "queries", "summary": "summaries", "box": "boxes", "email": "emails"}
SINGULAR = {plural: noun for noun, plural in NOUNS.items()}
UNSETTLED = {S.QUEUED, S.RUNNING, S.AWAITING_RECONCILIATION}


@dataclass(frozen=True)
class Item:
    state: str
    reported: str | None
    noun: str
    kind: str
    started: bool
    reconciled: bool
    record: tuple[str, bool] | None  # effect, reversible


@st.composite
def items(draw) -> Item:  # type: ignore[no-untyped-def]
    state = draw(st.sampled_from(S.values))
    reported = draw(st.one_of(st.none(), st.sampled_from([S.COMPLETED, S.FAILED, S.CANCELLED])))
    if reported == state:
        reported = None
    started = state not in (S.QUEUED, S.CANCELLED) or draw(st.booleans())
    reconciled = started and draw(st.booleans())
    record = draw(st.one_of(st.none(), st.tuples(st.sampled_from(Effect.values), st.booleans())))
    return Item(
        state,
        reported,
        draw(st.sampled_from(list(NOUNS))),
        draw(st.sampled_from(Kind.values)),
        started,
        reconciled,
        record,
    )


def _aggregate(ledger: list[Item], stopped: bool) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """What task_summary's two GROUP BY queries return for these items."""
    rows: Counter[tuple] = Counter()  # type: ignore[type-arg]
    started: Counter[tuple] = Counter()  # type: ignore[type-arg]
    reconciled: Counter[tuple] = Counter()  # type: ignore[type-arg]
    effects: Counter[tuple] = Counter()  # type: ignore[type-arg]
    late: Counter[tuple] = Counter()  # type: ignore[type-arg]
    for it in ledger:
        key = (it.state, it.reported, it.noun, it.kind)
        rows[key] += 1
        started[key] += it.started
        reconciled[key] += it.reconciled and stopped
        if it.record and latest_outcome(it.state, it.reported) == S.COMPLETED:
            ekey = (it.noun, it.record[0], it.record[1])
            effects[ekey] += 1
            late[ekey] += bool(it.reported)
    return (
        [
            {
                "state": k[0],
                "reported": k[1],
                "noun": k[2],
                "noun_plural": "",
                "kind": k[3],
                "n": n,
                "started": started[k],
                "reconciled": reconciled[k],
            }
            for k, n in rows.items()
        ],
        [
            {"item__noun": k[0], "item__noun_plural": "", "effect": k[1], "reversible": k[2], "n": n, "late": late[k]}
            for k, n in effects.items()
        ],
    )


def _number(word: str) -> int:
    word = word.lower()
    return _WORDS.index(word) if word in _WORDS else int(word)


def _category(phrase: str) -> str:
    if phrase.startswith("discarded") or phrase.startswith("cancelled before") or phrase.startswith("stopped"):
        return S.CANCELLED
    if phrase.startswith("completed") or phrase.split(";")[0] in Effect.values:
        return S.COMPLETED
    if phrase.startswith("failed"):
        return S.FAILED
    if phrase.startswith("still being checked"):
        return "unsettled"
    if phrase.startswith("with unknown outcome"):
        return S.UNCERTAIN
    raise AssertionError(f"a sentence the property does not know: {phrase!r}")


def _expected_category(it: Item) -> str:
    outcome = latest_outcome(it.state, it.reported)
    return "unsettled" if outcome in UNSETTLED else outcome


@settings(max_examples=500, deadline=None)
@given(ledger=st.lists(items(), max_size=30), stopped=st.booleans())
def test_every_sentence_counts_the_items_it_names_by_their_latest_outcome(ledger, stopped):
    rows, effects = _aggregate(ledger, stopped)
    text = compose(rows, effects, stopped=stopped)
    sentences = re.split(r"(?<=\.) ", text)
    head, claims = sentences[0], sentences[1:]

    named: Counter[tuple[str, str]] = Counter()
    for sentence in claims:
        match = re.fullmatch(r"(\w+) (\w+) (.+)\.", sentence)
        assert match, sentence
        n, noun_word, phrase = _number(match[1]), match[2], match[3]
        noun = SINGULAR.get(noun_word, noun_word)
        assert noun in NOUNS, sentence
        # Singular and plural agree with the number.
        assert (noun_word == noun) == (n == 1), sentence
        assert n > 0, sentence
        named[(noun, _category(phrase))] += n
        if "contradicts" in phrase or "contradict " in phrase:
            assert "review required" in phrase

    expected: Counter[tuple[str, str]] = Counter()
    for it in ledger:
        category = _expected_category(it)
        if category == "unsettled" and not stopped:
            continue  # a running task tells these as progress ("Running: 2 of 5 items finished.")
        expected[(it.noun, category)] += 1
    # Each sentence's number matches the items it names; no completed item is called discarded or
    # cancelled (it would be counted under the wrong category); the counts add up to the items.
    assert named == expected, text
    unsettled = sum(1 for it in ledger if _expected_category(it) == "unsettled")
    assert sum(named.values()) + (0 if stopped else unsettled) == len(ledger)

    if stopped:
        had_work = any(
            it.reconciled
            or _expected_category(it) in ("unsettled", S.UNCERTAIN)
            or latest_outcome(it.state, it.reported) == S.CANCELLED
            # recorded cancelled, yet it ran (a late report): Stop met it in flight
            or (it.state == S.CANCELLED and it.reported not in (None, S.CANCELLED))
            for it in ledger
        )
        assert head == ("Stopped new work." if had_work else "Stop requested; nothing was left to stop.")
        if any(it.reconciled for it in ledger):
            assert "nothing was left" not in text
    elif not ledger:
        assert text == "No work recorded yet."
    elif unsettled:
        assert (
            head
            == f"Running: {len(ledger) - unsettled} of {len(ledger)} item{'s' if len(ledger) != 1 else ''} finished."
        )
    else:
        assert head == "Finished."
    # A contradicted item always asks for review.
    if any(it.reported for it in ledger):
        assert "review required" in text


def test_the_seed_sentence():
    rows = [
        {
            "state": S.CANCELLED,
            "reported": None,
            "noun": "draft",
            "noun_plural": "",
            "kind": Kind.MODEL_REQUEST,
            "n": 2,
            "started": 0,
            "reconciled": 0,
        },
        {
            "state": S.COMPLETED,
            "reported": None,
            "noun": "record",
            "noun_plural": "",
            "kind": Kind.EXTERNAL_OPERATION,
            "n": 1,
            "started": 1,
            "reconciled": 0,
        },
    ]
    effects = [
        {"item__noun": "record", "item__noun_plural": "", "effect": "created", "reversible": True, "n": 1, "late": 0}
    ]
    assert (
        compose(rows, effects, stopped=True)
        == "Stopped new work. Two drafts discarded. One record created; review required."
    )
