"""Decisions on many uncertain items at once, from a group of the review queue: the rows a
reviewer ticked, or every item of the group (across its pages). With htmx the group is swapped in
place, so the page keeps its place; without, the form posts and redirects back to the queue."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from reconcile.services.review import OUTCOMES, ReviewRefused
from reconcile.services.review_sets import (
    MAX_ITEMS,
    Decided,
    items_acknowledge,
    items_escalate,
    items_extend,
    items_resolve,
)
from stopdesk import permissions as perms
from stopdesk.notify.selectors import review_queue_facts
from stopdesk.paging import ADMIN_CAP
from stopdesk.states import ItemState
from stopdesk.views import HtmxHttpRequest
from stopdesk.views.queue_groups import GROUP_BY_LABELS, QueueFilter, grouped_queue, selected_ids
from stopdesk.views.selectors import queue_late_results, review_queue

DONE = {
    "resolve": "Resolved",
    "extend": "Extended the deadline of",
    "escalate": "Escalated",
    "acknowledge": "Reviewed the late results of",
}


def people() -> Any:
    """Whom one can escalate to: active people in any review role."""
    return (
        get_user_model()
        .objects.filter(is_active=True, groups__name__in=("reviewers", "approvers"))
        .distinct()
        .order_by("username")
    )


def uncertain_context(request: HtmxHttpRequest, f: QueueFilter, **extra: Any) -> dict[str, Any]:
    return {
        "g": grouped_queue(f, request.user),
        "outcomes": [(o, ItemState(o).label) for o in OUTCOMES],
        "group_by_choices": list(GROUP_BY_LABELS.items()),
        "people": people().exclude(pk=request.user.pk),
        "can_resolve": perms.can(request.user, perms.RESOLVE),
        **extra,
    }


# The queue's sections a person clears besides the uncertain items and the compensations, which
# the facts count.
LISTED = ("late", "reversals", "before_stop", "escalations")


def waiting(facts: Any, sections: dict[str, Any]) -> int:
    """Everything in the queue that waits for a person, so the header never says "nothing" while
    late results, effects (after Stop or before it) or escalations wait."""
    listed = sum(sections[key].count for key in LISTED)
    return int(facts.uncertain) + int(facts.waiting_compensations) + listed


def header_context() -> dict[str, Any]:
    """The queue's header, sent along with a swapped group or section so its counts stay true."""
    sections = {k: v for key in LISTED for k, v in review_queue({}, only=key).items()}
    facts = review_queue_facts(cap=ADMIN_CAP)
    return {"facts": facts, "waiting": waiting(facts, sections), "oob": True}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _selection(request: HtmxHttpRequest, f: QueueFilter) -> list[int]:
    if request.POST.get("all") == "1":
        ids = selected_ids(f, request.user, MAX_ITEMS)
        seen = _int(request.POST.get("expected"))
        if seen is not None and len(ids) > seen:
            # Items joined the group after the page was read: nobody has looked at them yet.
            raise ReviewRefused(
                f"The group grew since you looked: it has {len(ids)} items now, not {seen}. "
                "Look at the new items and decide again."
            )
    else:
        ids = [i for i in (_int(v) for v in request.POST.getlist("item")) if i is not None]
    if len(ids) > MAX_ITEMS:
        raise ReviewRefused(f"Decide at most {MAX_ITEMS} items at once; narrow the group with the filter.")
    return ids


def _decide(request: HtmxHttpRequest, ids: list[int]) -> Decided:
    action, post, user = request.POST.get("action", ""), request.POST, request.user
    if action == "resolve":
        return items_resolve(
            item_ids=ids,
            outcome=post.get("outcome", ""),
            note=post.get("note", ""),
            evidence=post.get("evidence", ""),
            by=user,
        )
    if action == "extend":
        return items_extend(item_ids=ids, hours=_int(post.get("hours")) or 0, reason=post.get("note", ""), by=user)
    if action == "escalate":
        person = people().exclude(pk=user.pk).filter(pk=_int(post.get("to")) or 0).first()
        if person is None:
            raise ReviewRefused("Choose a person to escalate to.")
        return items_escalate(item_ids=ids, to=person, reason=post.get("note", ""), by=user)
    raise ReviewRefused("Choose resolve, extend or escalate.")


def notice_for(decided: Decided, outcome: str = "") -> str:
    n = len(decided.done)
    text = f"{DONE[decided.action]} {n} item{'' if n == 1 else 's'}"
    if decided.action == "resolve" and outcome:
        text += f" as {outcome}"
    text += ", each with its own audit event."
    if decided.moved:
        shown = ", ".join(f"#{i}" for i in decided.moved[:20])
        text += f" {len(decided.moved)} had moved meanwhile and were left as they are: {shown}."
    return text


@require_POST
@perms.require(perms.RESOLVE)
def queue_decide(request: HtmxHttpRequest) -> HttpResponse:
    """One decision with one note for the selected items of a group."""
    f = QueueFilter.from_query(request.POST)
    try:
        decided = _decide(request, _selection(request, f))
    except ReviewRefused as exc:
        if request.htmx:
            context = uncertain_context(request, f, notice=f"Nothing was changed: {exc}", values=request.POST)
            return _group_response(request, context, status=400)
        messages.error(request, f"Nothing was changed: {exc}")
        return redirect(f"{_queue_url(f)}#uncertain")
    notice = notice_for(decided, request.POST.get("outcome", ""))
    seen = _int(request.POST.get("expected"))
    if request.POST.get("all") == "1" and seen is not None and seen > len(decided.done) + len(decided.moved):
        gone = seen - len(decided.done) - len(decided.moved)
        notice += f" {gone} of the {seen} you saw had been decided or had moved meanwhile and were left as they are."
    if request.htmx:
        return _group_response(request, uncertain_context(request, f, notice=notice))
    messages.success(request, notice)
    return redirect(f"{_queue_url(f)}#uncertain")


def _group_response(request: HtmxHttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    """The group again, in place: what is left of it with the notice on top, or only the notice
    once it is empty."""
    groups = context["g"].groups
    slug = (request.htmx.target or "").removeprefix("group-")
    group = next((g for g in groups if g.slug == slug), None)
    context = {**context, **header_context()}
    if group is None:
        return render(request, "review/queue_uncertain.html#group-done", {**context, "slug": slug}, status=status)
    return render(request, "review/queue_uncertain.html#group", {**context, "group": group}, status=status)


def _queue_url(f: QueueFilter) -> str:
    query = f.query()
    return reverse("review-queue") + (f"?{query}" if query else "")


@require_POST
@perms.require(perms.RESOLVE)
def queue_acknowledge(request: HtmxHttpRequest) -> HttpResponse:
    """One note for many late results: each item keeps its state, and its event its late report."""
    if request.POST.get("all") == "1":
        ids = list(queue_late_results().order_by("id").values_list("id", flat=True)[: MAX_ITEMS + 1])
    else:
        ids = [i for i in (_int(v) for v in request.POST.getlist("item")) if i is not None]
    status = 200
    try:
        if len(ids) > MAX_ITEMS:
            raise ReviewRefused(f"Decide at most {MAX_ITEMS} items at once.")
        notice = notice_for(items_acknowledge(item_ids=ids, note=request.POST.get("note", ""), by=request.user))
    except ReviewRefused as exc:
        notice, status = f"Nothing was changed: {exc}", 400
    if not request.htmx:
        (messages.success if status == 200 else messages.error)(request, notice)
        return redirect(f"{reverse('review-queue')}#late")
    context = {
        **header_context(),
        "s": review_queue({}, only="late"),
        "notice": notice,
        "can_resolve": perms.can(request.user, perms.RESOLVE),
    }
    return render(request, "review/queue.html#late", context, status=status)
