"""Stored JSON (evidence, mechanism details, attempt answers, event data) as a person reads it:
labelled fields, one per leaf value, never Python's text for a dict or a list."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django import template
from django.utils import dateformat, timezone

register = template.Library()

# A nested value deeper than this is shown as one field of JSON text rather than split further.
MAX_DEPTH = 6
MAX_FIELDS = 200
ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
SEP = " \u203a "  # between a nested key and its parent (a single right-pointing angle quote)


def field_label(key: str) -> str:
    """ "uncertain_because" -> "Uncertain because"; keys that are already words stay as written."""
    words = str(key).replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else "(blank)"


def field_value(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if isinstance(value, (dict, list)):
        import json

        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    if isinstance(value, str) and ISO_TIME.match(value):
        return moment(value)
    return str(value)


def moment(text: str) -> str:
    """A stored ISO timestamp as the pages write times ("Dec 1, 14:56:03"), in the site's zone."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return text
    if timezone.is_aware(at):
        at = timezone.localtime(at)
    return dateformat.format(at, "M j, H:i:s")


def readable(value: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """Flatten `value` into (label, text) pairs: nested keys become "Outer", SEP, "inner"; list
    entries "List", SEP, "1". Lists of plain values read as one comma-separated field."""
    if isinstance(value, dict):
        if not value:
            return [(prefix, "(none)")] if prefix else []
        pairs: list[tuple[str, str]] = []
        for key, inner in value.items():
            label = f"{prefix}{SEP}{field_label(key)}" if prefix else field_label(key)
            if depth >= MAX_DEPTH:
                pairs.append((label, field_value(inner)))
            else:
                pairs.extend(readable(inner, label, depth + 1))
        return pairs
    if isinstance(value, list):
        if not value:
            return [(prefix or "Value", "(none)")]
        if all(not isinstance(v, (dict, list)) for v in value):
            return [(prefix or "Value", ", ".join(field_value(v) for v in value))]
        pairs = []
        for n, inner in enumerate(value, start=1):
            pairs.extend(readable(inner, f"{prefix}{SEP}{n}" if prefix else str(n), depth + 1))
        return pairs
    return [(prefix or "Value", field_value(value))]


@register.filter
def readable_fields(value: Any) -> list[tuple[str, str]]:
    """The fields of `value`, at most MAX_FIELDS of them (the rest summed up in a last field)."""
    pairs = readable(value)
    if len(pairs) > MAX_FIELDS:
        rest = len(pairs) - MAX_FIELDS
        pairs = [*pairs[:MAX_FIELDS], ("…", f"{rest} more field{'s' if rest != 1 else ''} not shown")]
    return pairs
