"""The review queue and a reviewer's and approver's actions. Every action is a plain form that
works without JavaScript (POST, then redirect); htmx loads the forms in place."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from reconcile.selectors import compensation_for
from reconcile.services.compensation import (
    CompensationRefused,
    ReauthenticationRequired,
    compensation_actions,
    compensation_approve,
    compensation_escalate,
    compensation_propose,
    compensation_reject,
    compensation_request,
)
from reconcile.services.records import record_readings_compared
from reconcile.services.review import (
    OUTCOMES,
    ReviewRefused,
    item_acknowledge_late_result,
    item_escalate,
    item_extend_deadline,
    item_resolve,
)
from stopdesk import permissions as perms
from stopdesk.notify.selectors import review_queue_facts
from stopdesk.paging import ADMIN_CAP
from stopdesk.services.errors import IllegalTransition
from stopdesk.states import CompensationState, ItemState
from stopdesk.views import HtmxHttpRequest
from stopdesk.views.auth import reauth_check_password, reauth_fresh, reauthenticated_at
from stopdesk.views.queue import uncertain_context, waiting
from stopdesk.views.queue_groups import QueueFilter
from stopdesk.views.selectors import SECTIONS, now, review_queue

QUEUE_FRAGMENTS = ("uncertain", "late", "reversals", "proposals", "escalations")


def _int(value: Any, default: int = 1) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return default


@perms.require(*perms.REVIEW_ANY)
def queue(request: HtmxHttpRequest) -> HttpResponse:
    pages = {key: _int(request.GET.get(key)) for key in SECTIONS}
    target = request.htmx.target if request.htmx else None
    uncertain = QueueFilter.from_query(request.GET)
    if target == "uncertain":
        return render(request, "review/queue_uncertain.html#section", uncertain_context(request, uncertain))
    if target in QUEUE_FRAGMENTS:
        only = ["escalations", "escalated"] if target == "escalations" else [target]
        sections = {k: v for key in only for k, v in review_queue(pages, only=key).items()}
        return render(request, f"review/queue.html#{target}", _queue_context(request, sections, pages))
    # The uncertain items are read grouped (queue_groups); the other sections as pages.
    sections = {k: v for key in SECTIONS if key != "uncertain" for k, v in review_queue(pages, only=key).items()}
    context = {**_queue_context(request, sections, pages), **uncertain_context(request, uncertain)}
    context["waiting"] = waiting(context["facts"], sections)
    return render(request, "review/queue.html", context)


def _queue_context(request: HtmxHttpRequest, sections: dict, pages: dict) -> dict:  # type: ignore[type-arg]
    user = request.user
    return {
        "s": sections,
        "pages": pages,
        "now": now(),
        "facts": review_queue_facts(cap=ADMIN_CAP),
        "can_resolve": perms.can(user, perms.RESOLVE),
        "can_propose": perms.can(user, perms.PROPOSE),
        "can_approve": perms.can(user, perms.APPROVE),
    }


def _form_page(request: HtmxHttpRequest, template: str, context: dict, status: int = 200) -> HttpResponse:  # type: ignore[type-arg]
    """A form page: the whole page, or for htmx only the `action-panel` it is loaded into."""
    if request.htmx and _in_place(request):
        template += "#action-panel"
    response = render(request, template, context, status=status)
    target = request.htmx.target or "" if request.htmx else ""
    if status >= 400 and target.startswith(("uncertain-", "late-")):
        # Refused beside its row: the form comes back with its error where it was, not over the row.
        kind, _, pk = target.rpartition("-")
        response["HX-Retarget"] = f"#panel-{pk}" if kind == "uncertain" else f"#late-panel-{pk}"
        response["HX-Reswap"] = "innerHTML"
    return response


def _in_place(request: HtmxHttpRequest) -> bool:
    """An htmx request for a form shown in a panel: the page's, or the one beside a queue row
    (loaded into `panel-<id>`, posted back with the row as its target)."""
    target = request.htmx.target or ""
    return target == "action-panel" or target.startswith(("panel-", "uncertain-", "late-"))


def _row_done(request: HtmxHttpRequest, item: Any, notice: str) -> HttpResponse | None:
    """After a decision made beside its row: the row, replaced by what was done, so the page keeps
    its place. None for a plain form post (it redirects)."""
    target = (request.htmx.target or "") if request.htmx else ""
    if target not in (f"uncertain-{item.pk}", f"late-{item.pk}"):
        return None
    return render(request, "review/queue_uncertain.html#row-done", {"item": item, "notice": notice, "row_id": target})


def _people() -> Any:
    """Whom one can escalate to: active people in any review role."""
    return (
        get_user_model()
        .objects.filter(is_active=True, groups__name__in=("reviewers", "approvers"))
        .distinct()
        .order_by("username")
    )


@require_http_methods(["GET", "POST"])
@perms.require(perms.RESOLVE)
def item_resolve_view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = perms.item_for(request.user, item_id)
    context: dict[str, Any] = {"item": item, "outcomes": [(o, ItemState(o).label) for o in OUTCOMES], "error": ""}
    if request.method == "POST":
        try:
            item_resolve(
                item_id=item.pk,
                outcome=request.POST.get("outcome", ""),
                note=request.POST.get("note", ""),
                evidence=request.POST.get("evidence", ""),
                by=request.user,
            )
        except (ReviewRefused, IllegalTransition) as exc:
            context.update(error=str(exc), values=request.POST)
            return _form_page(request, "review/resolve.html", context, status=400)
        notice = f"Resolved {item.noun} #{item.pk} as {request.POST['outcome']}."
        in_place = _row_done(request, item, notice)
        if in_place:
            return in_place
        messages.success(request, notice)
        return redirect("review-queue")
    return _form_page(request, "review/resolve.html", context)


@require_http_methods(["GET", "POST"])
@perms.require(perms.RESOLVE)
def item_extend_view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = perms.item_for(request.user, item_id)
    context: dict[str, Any] = {"item": item, "error": "", "now": now()}
    if request.method == "POST":
        hours = _int(request.POST.get("hours"), 0)
        base = max(item.investigate_by or now(), now())
        try:
            if not 1 <= hours <= 24 * 14:
                raise ReviewRefused("Extend by 1 to 336 hours.")
            item_extend_deadline(
                item_id=item.pk,
                until=base + timedelta(hours=hours),
                reason=request.POST.get("reason", ""),
                by=request.user,
            )
        except ReviewRefused as exc:
            context.update(error=str(exc), values=request.POST)
            return _form_page(request, "review/extend.html", context, status=400)
        notice = f"Extended the deadline of {item.noun} #{item.pk} by {hours} hours."
        in_place = _row_done(request, item, notice)
        if in_place:
            return in_place
        messages.success(request, notice)
        return redirect("review-queue")
    return _form_page(request, "review/extend.html", context)


@require_http_methods(["GET", "POST"])
@perms.require(perms.RESOLVE)
def item_acknowledge_view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = perms.item_for(request.user, item_id)
    context: dict[str, Any] = {"item": item, "late": item.evidence.get("late_result", {}), "error": ""}
    if request.method == "POST":
        try:
            item_acknowledge_late_result(item_id=item.pk, note=request.POST.get("note", ""), by=request.user)
        except ReviewRefused as exc:
            context.update(error=str(exc), values=request.POST)
            return _form_page(request, "review/acknowledge.html", context, status=400)
        notice = f"Reviewed the late result of {item.noun} #{item.pk}."
        in_place = _row_done(request, item, notice)
        if in_place:
            return in_place
        messages.success(request, notice)
        return redirect("review-queue")
    return _form_page(request, "review/acknowledge.html", context)


@require_http_methods(["GET", "POST"])
@perms.require(perms.RESOLVE)
def item_escalate_view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = perms.item_for(request.user, item_id)
    people = _people().exclude(pk=request.user.pk)
    context: dict[str, Any] = {"item": item, "people": people, "error": "", "action": request.path}
    if request.method == "POST":
        person = people.filter(pk=_int(request.POST.get("to"), 0)).first()
        try:
            if person is None:
                raise ReviewRefused("Choose a person to escalate to.")
            item_escalate(item_id=item.pk, to=person, reason=request.POST.get("reason", ""), by=request.user)
        except ReviewRefused as exc:
            context.update(error=str(exc), values=request.POST)
            return _form_page(request, "review/escalate.html", context, status=400)
        notice = f"Escalated {item.noun} #{item.pk} to {person.get_username()}."
        in_place = _row_done(request, item, notice)
        if in_place:
            return in_place
        messages.success(request, notice)
        return redirect("review-queue")
    return _form_page(request, "review/escalate.html", context)


@require_http_methods(["GET", "POST"])
@perms.require(perms.PROPOSE)
def record_propose_view(request: HtmxHttpRequest, record_id: int) -> HttpResponse:
    record = perms.record_for(request.user, record_id)
    actions = compensation_actions(record)
    context: dict[str, Any] = {"record": record, "actions": actions, "error": ""}
    if request.method == "POST":
        try:
            compensation = compensation_propose(
                record_id=record.pk,
                action=request.POST.get("action", ""),
                note=request.POST.get("note", "").strip(),
                by=request.user,
            )
        except CompensationRefused as exc:
            context.update(error=str(exc), values=request.POST)
            return _form_page(request, "review/propose.html", context, status=400)
        moved = compensation.expected_version != record.version
        messages.success(
            request,
            (
                f"{record.system} answered that the record is now at version {compensation.expected_version} "
                f"(stopdesk had recorded {record.version or 'no version'}); proposed at version "
                f"{compensation.expected_version}. "
                if moved
                else "Proposed. "
            )
            + "Another person with the approver role must approve it.",
        )
        return redirect("compensation-detail", compensation_id=compensation.pk)
    return _form_page(request, "review/propose.html", context)


def _reauth_until(request: HtmxHttpRequest) -> Any:
    """When the password entered last stops counting for approvals."""
    at = reauthenticated_at(request)
    return at + timedelta(seconds=settings.STOPDESK_REAUTH_SECONDS) if at else None


@perms.require(*perms.REVIEW_ANY)
def compensation_detail(
    request: HtmxHttpRequest, compensation_id: int, error: str = "", status: int = 200
) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    user = request.user
    context = {
        "c": compensation,
        "record": compensation.external_record,
        "planned_request": compensation_request(compensation.external_record),
        "error": error,
        "reauth_fresh": reauth_fresh(request),
        "reauth_until": _reauth_until(request),
        "reauth_minutes": settings.STOPDESK_REAUTH_SECONDS // 60,
        "can_approve": perms.can(user, perms.APPROVE) and compensation.proposed_by_id != user.pk,
        "own_proposal": compensation.proposed_by_id == user.pk,
        "is_approver": perms.can(user, perms.APPROVE),
        "people": _people().exclude(pk=user.pk),
        "live": compensation.state in (CompensationState.APPROVED, CompensationState.RUNNING),
        "can_decide": perms.can(user, perms.PROPOSE, perms.APPROVE),
        "versions": record_readings_compared(compensation=compensation),
        # What replaced it, when it was proposed again: what is pending now.
        "later": compensation.external_record.compensations.filter(pk__gt=compensation.pk).order_by("pk").first(),
    }
    if request.htmx and request.htmx.target == "compensation-status":
        response = render(request, "review/compensation.html#compensation-status", context)
        if not context["live"]:
            response.status_code = 286
        return response
    return render(request, "review/compensation.html", context, status=status)


@require_POST
@perms.require(perms.APPROVE)
def compensation_approve_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    password = request.POST.get("password", "")
    if password and not reauth_check_password(request, password):
        return compensation_detail(request, compensation.pk, error="That password is not right.", status=403)
    try:
        compensation_approve(
            compensation_id=compensation.pk, by=request.user, reauthenticated_at=reauthenticated_at(request)
        )
    except ReauthenticationRequired as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=403)
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=403)
    messages.success(request, "Approved. It runs now, after a fresh read of the record's version.")
    return redirect("compensation-detail", compensation_id=compensation.pk)


@require_POST
@perms.require(perms.APPROVE)
def compensation_reject_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    try:
        compensation_reject(compensation_id=compensation.pk, by=request.user, reason=request.POST.get("reason", ""))
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=400)
    messages.success(request, "Rejected.")
    return redirect("compensation-detail", compensation_id=compensation.pk)


@require_POST
@perms.require(perms.PROPOSE, perms.APPROVE)
def compensation_escalate_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    person = _people().exclude(pk=request.user.pk).filter(pk=_int(request.POST.get("to"), 0)).first()
    try:
        if person is None:
            raise CompensationRefused("Choose a person to escalate to.")
        compensation_escalate(
            compensation_id=compensation.pk, by=request.user, to=person, reason=request.POST.get("reason", "")
        )
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=400)
    messages.success(request, f"Escalated to {person.get_username()}.")
    return redirect(reverse("compensation-detail", kwargs={"compensation_id": compensation.pk}))
