"""Who may do what, and the one place pages look objects up on a person's behalf.

Roles are Django groups. The custom permissions live on the ledger's content types; the data
migration `reconcile/0003_roles` creates them with the groups, and `roles_ensure()` does the same
for tests and `create_demo_users` (a flushed test database has no migration data).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.apps import apps as global_apps
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django_htmx.http import HttpResponseClientRedirect

from stopdesk.models import ExternalRecord, Task, WorkItem

VIEW = "stopdesk.view_task"
STOP = "stopdesk.stop_task"
RESOLVE = "stopdesk.resolve_workitem"
PROPOSE = "reconcile.propose_compensation"
APPROVE = "reconcile.approve_compensation"
REVIEW_ANY = (RESOLVE, PROPOSE, APPROVE)

# (app_label, model, codename, name) for the permissions Django does not create by itself.
CUSTOM_PERMISSIONS = [
    ("stopdesk", "task", "stop_task", "Can stop a task"),
    ("stopdesk", "workitem", "resolve_workitem", "Can resolve, extend or escalate a work item"),
    ("reconcile", "compensation", "propose_compensation", "Can propose a compensation"),
    ("reconcile", "compensation", "approve_compensation", "Can approve or reject a compensation"),
]
_SEE = [
    ("stopdesk", "task", "view_task"),
    ("stopdesk", "workitem", "view_workitem"),
    ("stopdesk", "externalrecord", "view_externalrecord"),
    ("reconcile", "compensation", "view_compensation"),
]
ROLES: dict[str, list[tuple[str, str, str]]] = {
    "operators": [*_SEE, ("stopdesk", "task", "stop_task")],
    "reviewers": [
        *_SEE,
        ("stopdesk", "workitem", "resolve_workitem"),
        ("reconcile", "compensation", "propose_compensation"),
    ],
    "approvers": [*_SEE, ("reconcile", "compensation", "approve_compensation")],
}


def roles_ensure(apps: Any = global_apps) -> None:
    """Create the groups and their permissions; idempotent. `apps` is a migration's app registry
    or the global one."""
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    group_model = apps.get_model("auth", "Group")
    names = {codename: name for _, _, codename, name in CUSTOM_PERMISSIONS}
    for group_name, perms in ROLES.items():
        group, _ = group_model.objects.get_or_create(name=group_name)
        for app_label, model, codename in perms:
            content_type, _ = content_type_model.objects.get_or_create(app_label=app_label, model=model)
            permission, _ = permission_model.objects.get_or_create(
                content_type=content_type,
                codename=codename,
                defaults={"name": names.get(codename, f"Can view {model}")},
            )
            group.permissions.add(permission)


def can(user: Any, *perms: str) -> bool:
    """True when the user holds any of `perms`."""
    return any(user.has_perm(p) for p in perms)


def require(*perms: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Anonymous: to the login page (an htmx request is told to go there as a whole page).
    Signed in without any of `perms`: 403."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                if getattr(request, "htmx", False):
                    return HttpResponseClientRedirect(redirect_to_login(request.get_full_path())["Location"])
                return redirect_to_login(request.get_full_path())
            if not can(request.user, *perms):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def check(user: Any, *perms: str) -> None:
    if not can(user, *perms):
        raise PermissionDenied


# Lookups. Every signed-in role sees every task: stopdesk has no per-team scoping yet, so the
# scope is the permission itself. Keeping the lookups here is what makes adding scoping one edit.


def tasks_for(user: Any) -> QuerySet[Task]:
    check(user, VIEW)
    return Task.objects.all()


def task_for(user: Any, pk: int) -> Task:
    return get_object_or_404(tasks_for(user), pk=pk)


def item_seen_by(user: Any, pk: int) -> WorkItem:
    """An item of a task the user may see (to read; acting on it is `item_for`)."""
    items = WorkItem.objects.select_related("task__owner", "task__runtime", "parent").filter(task__in=tasks_for(user))
    return get_object_or_404(items, pk=pk)


def item_for(user: Any, pk: int) -> WorkItem:
    check(user, RESOLVE)
    return get_object_or_404(WorkItem.objects.select_related("task"), pk=pk)


def record_for(user: Any, pk: int) -> ExternalRecord:
    check(user, PROPOSE)
    return get_object_or_404(ExternalRecord.objects.select_related("item__task"), pk=pk)
