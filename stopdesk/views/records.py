"""Ways out that need one person: an escalated compensation read again, proposed again at the
record's current version or accepted as it is; completed effects accepted as they are (many at
once, one note) or put on the reversal list. Plain forms (POST, then redirect)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from reconcile.selectors import compensation_for
from reconcile.services.compensation import CompensationRefused
from reconcile.services.escalation import compensation_accept_as_is, compensation_propose_current, compensation_reread
from reconcile.services.records import RecordDecisionRefused, record_flag_for_reversal, records_accept_as_is
from stopdesk import permissions as perms
from stopdesk.views import HtmxHttpRequest
from stopdesk.views.review import compensation_detail


@require_POST
@perms.require(perms.PROPOSE, perms.APPROVE)
def compensation_reread_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    try:
        compensation = compensation_reread(compensation_id=compensation.pk, by=request.user)
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=400)
    reading = compensation.readings.order_by("-requested_at", "-id").first()
    if reading is not None and reading.ok:
        messages.success(request, f"Read the record again: it is at version {reading.version or 'unknown'}.")
    else:
        messages.error(request, f"Could not read the record: {reading.error if reading else 'no answer'}.")
    return redirect("compensation-detail", compensation_id=compensation.pk)


@require_POST
@perms.require(perms.PROPOSE, perms.APPROVE)
def compensation_propose_current_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    try:
        new = compensation_propose_current(
            compensation_id=compensation.pk, by=request.user, note=request.POST.get("note", "")
        )
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=400)
    messages.success(
        request,
        f"Proposed again at version {new.expected_version or 'unknown'}. "
        "Another person with the approver role must approve it.",
    )
    return redirect("compensation-detail", compensation_id=new.pk)


@require_POST
@perms.require(perms.PROPOSE, perms.APPROVE)
def compensation_accept_view(request: HtmxHttpRequest, compensation_id: int) -> HttpResponse:
    compensation = compensation_for(request.user, compensation_id)
    try:
        compensation_accept_as_is(compensation_id=compensation.pk, by=request.user, note=request.POST.get("note", ""))
    except CompensationRefused as exc:
        return compensation_detail(request, compensation.pk, error=str(exc), status=400)
    messages.success(request, "Accepted the record as it is. Nothing was sent to its system.")
    return redirect("compensation-detail", compensation_id=compensation.pk)


@require_POST
@perms.require(perms.PROPOSE)
def records_accept_view(request: HtmxHttpRequest) -> HttpResponse:
    """Accept the ticked effects (or every effect the form listed, with "all") as they are."""
    field = "listed" if request.POST.get("all") else "record"
    ids = [int(v) for v in request.POST.getlist(field) if v.isdigit()]
    back = request.POST.get("section") if request.POST.get("section") in ("reversals", "before-stop") else "reversals"
    try:
        records = records_accept_as_is(record_ids=ids, by=request.user, note=request.POST.get("note", ""))
    except RecordDecisionRefused as exc:
        messages.error(request, str(exc))
        return redirect(reverse("review-queue") + f"#{back}")
    n = len(records)
    messages.success(request, f"Accepted {n} effect{'s' if n != 1 else ''} as {'they are' if n != 1 else 'it is'}.")
    return redirect(reverse("review-queue") + f"#{back}")


@require_POST
@perms.require(perms.PROPOSE)
def record_flag_view(request: HtmxHttpRequest, record_id: int) -> HttpResponse:
    record = perms.record_for(request.user, record_id)
    try:
        record_flag_for_reversal(record_id=record.pk, by=request.user, note=request.POST.get("note", ""))
    except RecordDecisionRefused as exc:
        messages.error(request, str(exc))
        return redirect(reverse("review-queue") + "#before-stop")
    messages.success(request, f"Put {record.system} {record.record_id} on the reversal list.")
    return redirect(reverse("review-queue") + f"#record-{record.pk}")
