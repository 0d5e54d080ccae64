"""The engine alone: facts and an observation in, a plan out. No database, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reconcile.engine import ItemFacts, decide
from reconcile.mechanisms.base import MechanismSettings, Observation, Seen
from stopdesk.states import ItemState

S = ItemState
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CFG = MechanismSettings(deadline_s=60, backoff_initial_s=1, backoff_max_s=8, recheck_interval_s=5)


def facts(state: str = S.RUNNING, **kw) -> ItemFacts:  # type: ignore[no-untyped-def]
    return ItemFacts(state=state, cancel_requested=kw.pop("cancel_requested", True), since=T0, **kw)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_read_back_cancelled_settles_the_item():
    plan = decide(facts(), Observation(Seen.CANCELLED), at(1), CFG)
    assert plan.to_state == S.CANCELLED and plan.next_check_at is None


def test_a_cancelled_is_watched_when_the_mechanism_has_seen_flips():
    cfg = MechanismSettings(recheck_after_cancelled_s=30, recheck_interval_s=5)
    plan = decide(facts(), Observation(Seen.CANCELLED), at(1), cfg)
    assert plan.to_state == S.CANCELLED and plan.next_check_at == at(6)
    watching = decide(facts(S.CANCELLED, cancelled_at=at(1)), Observation(Seen.CANCELLED), at(6), cfg)
    # Growing intervals: 5 s after the cancel, then 15 s after that, then capped at the window.
    assert watching.to_state is None and watching.next_check_at == at(21)
    last = decide(facts(S.CANCELLED, cancelled_at=at(1)), Observation(Seen.CANCELLED), at(21), cfg)
    assert last.next_check_at == at(31)
    done = decide(facts(S.CANCELLED, cancelled_at=at(1)), Observation(Seen.CANCELLED), at(31), cfg)
    assert done.next_check_at is None


def test_completed_after_cancelled_is_a_late_result_never_an_overwrite():
    plan = decide(facts(S.CANCELLED, cancelled_at=at(1)), Observation(Seen.COMPLETED), at(3), CFG)
    assert plan.to_state is None and plan.late_result == S.COMPLETED


def test_completed_after_a_cancel_request_says_the_cancel_did_not_take_effect():
    plan = decide(facts(), Observation(Seen.COMPLETED), at(3), CFG)
    assert plan.to_state == S.COMPLETED and "did not take effect" in plan.outcome


def test_unanswered_checks_back_off_until_the_deadline_then_uncertain():
    f = facts()
    delays = []
    now = at(0)
    while True:
        plan = decide(f, Observation(Seen.UNREACHABLE), now, CFG)
        if plan.to_state == S.UNCERTAIN:
            break
        delays.append((plan.next_check_at - now).total_seconds())
        now = plan.next_check_at
        f = facts(failures=plan.failures)
    assert delays[:5] == [1, 2, 4, 8, 8]
    assert now == at(60)  # the last check lands exactly on the deadline
    assert plan.investigate_by == at(60) + timedelta(hours=24)


def test_investigate_by_comes_from_the_mechanism_when_it_sets_one():
    cfg = MechanismSettings(deadline_s=10, investigate_by_hours=2)
    plan = decide(facts(), Observation(Seen.RUNNING), at(10), cfg)
    assert plan.to_state == S.UNCERTAIN and plan.investigate_by == at(10) + timedelta(hours=2)


def test_no_lookup_means_uncertain_at_once():
    plan = decide(facts(), Observation(Seen.UNKNOWABLE, message="no lookup"), at(0), CFG)
    assert plan.to_state == S.UNCERTAIN


def test_nothing_to_ask_waits_for_a_report_in_awaiting_reconciliation():
    plan = decide(facts(), Observation(Seen.AWAITING_REPORT), at(0), CFG)
    assert plan.to_state == S.AWAITING_RECONCILIATION and plan.next_check_at == at(60)


def test_not_found_is_no_answer_while_our_own_request_may_be_in_flight():
    cfg = MechanismSettings(call_timeout_s=10, deadline_s=60)
    early = decide(facts(submitted_at=at(0)), Observation(Seen.NO_EFFECT), at(5), cfg)
    assert early.to_state is None and early.next_check_at is not None
    later = decide(facts(submitted_at=at(0)), Observation(Seen.NO_EFFECT), at(11), cfg)
    assert later.to_state == S.CANCELLED


def test_an_uncertain_item_keeps_its_investigate_by_deadline():
    plan = decide(facts(S.UNCERTAIN), Observation(Seen.UNREACHABLE), at(100), CFG)
    assert plan.to_state is None and plan.investigate_by is None


def test_a_fact_found_later_settles_an_uncertain_item():
    plan = decide(facts(S.UNCERTAIN), Observation(Seen.COMPLETED), at(100), CFG)
    assert plan.to_state == S.COMPLETED


def test_the_flip_watch_reads_back_at_growing_intervals_within_its_window():
    cfg = MechanismSettings(recheck_interval_s=5, recheck_after_cancelled_s=600, watch_growth=3)
    cancelled = at(0)
    schedule, now = [], cancelled
    while True:
        plan = decide(facts(S.CANCELLED, cancelled_at=cancelled), Observation(Seen.CANCELLED), now, cfg)
        if plan.next_check_at is None:
            break
        now = plan.next_check_at
        schedule.append((now - cancelled).total_seconds())
    assert schedule == [5, 20, 65, 200, 600]


def test_the_watch_schedule_is_a_setting_and_a_late_sweep_does_not_push_it_back():
    cfg = MechanismSettings(recheck_after_cancelled_s=100, watch_first_s=2, watch_growth=2)
    # Points at 2, 6, 14, 30, 62, then the window's end at 100.
    late = decide(facts(S.CANCELLED, cancelled_at=at(0)), Observation(Seen.CANCELLED), at(20), cfg)
    assert late.next_check_at == at(30)
    even = MechanismSettings(recheck_after_cancelled_s=30, recheck_interval_s=5, watch_growth=1)
    plan = decide(facts(S.CANCELLED, cancelled_at=at(0)), Observation(Seen.CANCELLED), at(5), even)
    assert plan.next_check_at == at(10)
