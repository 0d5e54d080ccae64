"""Two small pages: the deliveries (admins), and each person's choice of email topics."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required, user_passes_test
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from stopdesk.notify.delivery import email_topics
from stopdesk.notify.models import EmailPreference
from stopdesk.notify.selectors import deliveries_recent
from stopdesk.notify.topics import CHOOSABLE


@login_required
@user_passes_test(lambda u: u.is_staff)
def deliveries_page(request: HttpRequest) -> HttpResponse:
    page = Paginator(deliveries_recent(), 50).get_page(request.GET.get("page"))
    return render(request, "notify/deliveries.html", {"page": page})


@login_required
def email_choices(request: HttpRequest) -> HttpResponse:
    """GET shows the topics (the role's defaults until the person chooses); POST saves the choice."""
    user: Any = request.user
    error = ""
    if request.method == "POST":
        chosen = request.POST.getlist("topics")
        unknown = sorted(set(chosen) - {t.value for t in CHOOSABLE})
        if unknown:
            error = f"Unknown topic(s): {', '.join(unknown)}."
        else:
            per_item = request.POST.get("per_item") == "on"
            EmailPreference.objects.update_or_create(
                user=user, defaults={"topics": sorted(set(chosen)), "per_item": per_item}
            )
            return redirect("notify-email")
    groups = set(user.groups.values_list("name", flat=True))
    current = email_topics(user, groups)
    saved = EmailPreference.objects.filter(user=user).first()
    context = {
        "topics": [(t.value, t.label, t.value in current) for t in CHOOSABLE],
        "per_item": bool(saved and saved.per_item),
        "chosen_before": saved is not None,
        "email": user.email,
        "error": error,
    }
    return render(request, "notify/email.html", context, status=400 if error else 200)
