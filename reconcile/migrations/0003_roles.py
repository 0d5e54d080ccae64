"""Roles: operators may stop, reviewers resolve and propose, approvers approve compensation.

The role table is frozen here (a migration must not change meaning when app code does later);
`stopdesk.permissions.ROLES` is the same data for tests and `create_demo_users`.
"""

from django.db import migrations

CUSTOM = [
    ("stopdesk", "task", "stop_task", "Can stop a task"),
    ("stopdesk", "workitem", "resolve_workitem", "Can resolve, extend or escalate a work item"),
    ("reconcile", "compensation", "propose_compensation", "Can propose a compensation"),
    ("reconcile", "compensation", "approve_compensation", "Can approve or reject a compensation"),
]
SEE = [
    ("stopdesk", "task", "view_task"),
    ("stopdesk", "workitem", "view_workitem"),
    ("stopdesk", "externalrecord", "view_externalrecord"),
    ("reconcile", "compensation", "view_compensation"),
]
ROLES = {
    "operators": [*SEE, ("stopdesk", "task", "stop_task")],
    "reviewers": [
        *SEE,
        ("stopdesk", "workitem", "resolve_workitem"),
        ("reconcile", "compensation", "propose_compensation"),
    ],
    "approvers": [*SEE, ("reconcile", "compensation", "approve_compensation")],
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    names = {codename: name for _, _, codename, name in CUSTOM}
    for group_name, perms in ROLES.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        for app_label, model, codename in perms:
            content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
            permission, _ = Permission.objects.get_or_create(
                content_type=content_type,
                codename=codename,
                defaults={"name": names.get(codename, f"Can view {model}")},
            )
            group.permissions.add(permission)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reconcile", "0002_review_decisions"),
        ("stopdesk", "0002_event_append_only"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_roles, remove_roles)]
