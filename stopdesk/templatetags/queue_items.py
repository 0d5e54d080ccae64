"""Template helpers for the review queue."""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse

register = template.Library()


@register.filter
def item_url(item_id: int) -> str:
    """The item's own page (`item-detail`). Until that page is routed, its path is written out,
    so the queue's links already point where the page will be."""
    try:
        return reverse("item-detail", kwargs={"item_id": item_id})
    except NoReverseMatch:
        return f"/items/{int(item_id)}/"
