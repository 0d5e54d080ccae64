"""Items whose declaration named where the server should connect (a URL, header or key in
detail.http / detail.openai / detail.mcp), written before such declarations were refused: the
overrides are set aside under detail["overrides_refused"] (kept as evidence, never used: the
adapters read only configuration), the item is flagged for review, and an event says what was
found. Nothing is silently used, and nothing is silently dropped."""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.utils import timezone

SECTIONS = ("http", "openai", "mcp")
MESSAGE = (
    "Its declaration named where the server should connect ({fields}). That is configuration now: "
    "the override was set aside, never used. Check this item's effects against its configured system."
)


def _pop(detail: dict[str, Any], path: str) -> Any:
    parts = path.split(".")[1:]  # "detail.http.reverse" -> ["http", "reverse"]
    node: Any = detail
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1] if parts else ""
    if isinstance(node, list):
        return node.pop(int(last))
    return node.pop(last)


def set_aside(detail: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    from reconcile.mechanisms.declared import steering_problem

    cleaned = {k: v for k, v in detail.items()}
    for section in SECTIONS:
        if isinstance(cleaned.get(section), dict):
            cleaned[section] = _deep_copy(cleaned[section])
    refused: dict[str, Any] = {}
    while (problem := steering_problem(cleaned)) is not None:
        if problem.field.count(".") == 1:  # the whole section is unusable (not an object)
            refused[problem.field] = cleaned.pop(problem.field.split(".")[1])
        else:
            refused[problem.field] = _pop(cleaned, problem.field)
    return cleaned, refused


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def flag(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    WorkItem = apps.get_model("stopdesk", "WorkItem")
    Event = apps.get_model("stopdesk", "Event")
    candidates = WorkItem.objects.filter(detail__has_any_keys=list(SECTIONS)).only(
        "pk", "task_id", "state", "detail", "needs_review"
    )
    for item in candidates.iterator(chunk_size=500):
        cleaned, refused = set_aside(item.detail or {})
        if not refused:
            continue
        cleaned["overrides_refused"] = {**cleaned.get("overrides_refused", {}), **refused}
        WorkItem.objects.filter(pk=item.pk).update(detail=cleaned, needs_review=True)
        Event.objects.create(
            at=timezone.now(),
            task_id=item.task_id,
            item_id=item.pk,
            kind="declaration_flagged",
            actor="system:migration",
            from_state=item.state,
            to_state=item.state,
            message=MESSAGE.format(fields=", ".join(sorted(refused))),
            data={"overrides_refused": refused},
        )


class Migration(migrations.Migration):
    dependencies = [
        ("stopdesk", "0017_settle_sees_registrations"),
    ]

    operations = [migrations.RunPython(flag, migrations.RunPython.noop)]
