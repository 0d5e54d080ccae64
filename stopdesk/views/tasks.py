"""The task list, the task page (summary, Stop, children by state) and a task's items by state."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods

from stopdesk import permissions as perms
from stopdesk.paging import CappedPaginator
from stopdesk.services.events import actor_for
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from stopdesk.views import HtmxHttpRequest
from stopdesk.views.selectors import (
    GROUP_ORDER,
    TASK_STATUSES,
    items_with_trail,
    task_gateway_facts,
    task_overview,
    tasks_flag,
    tasks_listing,
    tasks_review_count,
)

POLL_SETTLED = 286  # htmx stops polling on this status
STOP_REASON_MAX = 2000  # as the runtime API takes it (stopdesk.agent.schemas.RequestStop)


@perms.require(perms.VIEW)
def task_list(request: HtmxHttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    q = request.GET.get("q", "").strip()[:200]
    tasks = tasks_listing(perms.tasks_for(request.user), status=status, q=q)
    page = CappedPaginator(tasks, 25).get_page(request.GET.get("page"))
    tasks_flag(list(page.object_list))
    context = {
        "page": page,
        "status": status,
        "q": q,
        "statuses": TASK_STATUSES,
        "review_count": tasks_review_count(perms.tasks_for(request.user)),
    }
    template = "tasks/list.html"
    if request.htmx and request.htmx.target == "task-table":
        template += "#task-table"
    return render(request, template, context)


def _task_context(request: HtmxHttpRequest, task_id: int, *, confirm: bool = False) -> dict:  # type: ignore[type-arg]
    task = perms.task_for(request.user, task_id)
    return {
        "o": task_overview(task),
        "task": task,
        "can_stop": perms.can(request.user, perms.STOP),
        "confirm": confirm,
    }


LIVE_PARTS = ("stop-state", "stop-action", "summary", "timeline", "groups")


def _live(request: HtmxHttpRequest, context: dict, primary: str | None) -> HttpResponse:  # type: ignore[type-arg]
    """The fragment htmx asked for, plus the other live parts out of band, so one poll keeps the
    summary, the Stop control and the groups consistent with each other. The poller itself swaps
    nothing (primary None): every part arrives out of band, and the page skips a part a person is
    using (static/stopdesk/live.js)."""
    parts = []
    if primary:
        parts.append(render_to_string(f"tasks/detail.html#{primary}", context, request))
    for name in LIVE_PARTS:
        if name != primary:
            parts.append(render_to_string(f"tasks/detail.html#{name}", {**context, "oob": True}, request))
    status = POLL_SETTLED if context["o"].over else 200
    return HttpResponse("".join(parts), status=status)


@perms.require(perms.VIEW)
def task_detail(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    context = _task_context(request, task_id)
    target = request.htmx.target if request.htmx else None
    if target == "live":
        return _live(request, context, None)
    if target in LIVE_PARTS:
        return _live(request, context, target)
    context["gateway"] = task_gateway_facts(context["task"])  # the page's head: never polled
    return render(request, "tasks/detail.html", context)


@require_http_methods(["GET", "POST"])
@perms.require(perms.STOP)
def task_stop(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    """GET is the confirmation step; POST is Stop, and always records it, as the runtime API
    does: a task whose items have all settled may get new work the next moment, so "nothing is
    running now" is no reason to drop a person's Stop (and a closed task records it too, changing
    nothing that could start). A repeated POST (a second click, a second browser) gets the same
    stop request back, counted: task_request_stop is idempotent."""
    if request.method == "GET":
        context = _task_context(request, task_id, confirm=True)
        if request.htmx:
            response = _live(request, context, "stop-action")
            response.status_code = 200  # the form must arrive, whatever the task's state
            return response
        return render(request, "tasks/detail.html", context)
    task = perms.task_for(request.user, task_id)
    reason = request.POST.get("reason", "").strip()
    if len(reason) > STOP_REASON_MAX:
        # Refused whole, as the runtime API refuses it (422 naming the field): never cut short.
        context = _task_context(request, task_id, confirm=True)
        context["typed_reason"] = reason  # given back, to shorten rather than type again
        context["reason_error"] = f"The reason is {len(reason):,} characters; at most {STOP_REASON_MAX:,} are kept."
        template = "tasks/detail.html#stop-action" if request.htmx else "tasks/detail.html"
        return render(request, template, context, status=400)
    task_request_stop(task_id=task.pk, actor=actor_for(request.user), by=request.user, reason=reason)
    if not request.htmx:
        return redirect("task-detail", task_id=task.pk)
    context = _task_context(request, task_id)
    response = _live(request, context, "stop-action")
    response.status_code = 200  # the page needs the fragment even if everything settled at once
    return response


@perms.require(perms.VIEW)
def task_items(request: HtmxHttpRequest, task_id: int) -> HttpResponse:
    task = perms.task_for(request.user, task_id)
    state = request.GET.get("state", "")
    if state not in ItemState.values:
        state = GROUP_ORDER[0]
    items = items_with_trail(task.items.filter(state=state).order_by("id"))
    page = CappedPaginator(items, 50).get_page(request.GET.get("page"))
    context = {
        "task": task,
        "state": state,
        "state_label": ItemState(state).label,
        "page": page,
        "states": [(s, ItemState(s).label) for s in GROUP_ORDER],
        "can_resolve": perms.can(request.user, perms.RESOLVE),
    }
    template = "tasks/items.html"
    if request.htmx and request.htmx.target == "items-table":
        template += "#items-table"
    return render(request, template, context)
