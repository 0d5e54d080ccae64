"""The item page: one work item with everything needed to decide about it, readable by whoever may
see its task; reviewers also get its actions. And the early report of work that has no status
lookup (a plain form on that page)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from reconcile.services.report import item_report
from reconcile.services.review import ReviewRefused
from stopdesk import permissions as perms
from stopdesk.services.errors import IllegalTransition
from stopdesk.views import HtmxHttpRequest
from stopdesk.views.item_page import item_page

REPORT_CHOICES = (("done", "Done: it happened"), ("not_done", "Not done: it did not happen"))


def _context(request: HtmxHttpRequest, item_id: int, **extra: Any) -> dict[str, Any]:
    item = perms.item_seen_by(request.user, item_id)
    user = request.user
    return {
        "p": item_page(item),
        "item": item,
        "task": item.task,
        "can_resolve": perms.can(user, perms.RESOLVE),
        "can_propose": perms.can(user, perms.PROPOSE),
        "can_see_reviews": perms.can(user, *perms.REVIEW_ANY),
        "report_choices": REPORT_CHOICES,
        "error": "",
        "values": {},
        **extra,
    }


@perms.require(perms.VIEW)
def item_detail(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    return render(request, "items/detail.html", _context(request, item_id))


@require_POST
@perms.require(perms.RESOLVE)
def item_report_view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = perms.item_for(request.user, item_id)
    answer = request.POST.get("done", "")
    try:
        if answer not in dict(REPORT_CHOICES):
            raise ReviewRefused("Say whether it was done.")
        item_report(
            item_id=item.pk,
            done=answer == "done",
            note=request.POST.get("note", "")[:2000],
            evidence=request.POST.get("evidence", "")[:4000],
            by=request.user,
        )
    except (ReviewRefused, IllegalTransition) as exc:
        context = _context(request, item_id, error=str(exc), values=request.POST)
        return render(request, "items/detail.html", context, status=400)
    messages.success(request, f"Reported {item.noun} #{item.pk} as {'done' if answer == 'done' else 'not done'}.")
    return redirect("item-detail", item_id=item.pk)
