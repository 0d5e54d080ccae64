"""Demo people, one per role: `manage.py create_demo_users [--password P]`.

operator (may stop), reviewer (resolve, propose), approver and approver2 (approve; two, because
nobody approves their own proposal), and with --admin a superuser for the audit pages.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from stopdesk.config import require_migrated_database
from stopdesk.permissions import roles_ensure

PEOPLE = {"operator": "operators", "reviewer": "reviewers", "approver": "approvers", "approver2": "approvers"}


class Command(BaseCommand):
    help = "Create operator, reviewer and approver users in their groups (idempotent)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--password", default="", help="One password for all; default NAME-pass-123.")
        parser.add_argument("--admin", action="store_true", help="Also create a superuser 'admin'.")

    def handle(self, *args: Any, password: str = "", admin: bool = False, **options: Any) -> None:
        require_migrated_database()
        roles_ensure()
        users = get_user_model()
        for name, group in PEOPLE.items():
            secret = password or f"{name}-pass-123"
            user, created = users.objects.get_or_create(username=name, defaults={"email": f"{name}@example.test"})
            user.set_password(secret)
            user.save()
            user.groups.add(Group.objects.get(name=group))
            self.stdout.write(f"{'created' if created else 'updated'} {name} ({group}) password {secret}")
        if admin:
            secret = password or "admin-pass-123"
            user, created = users.objects.get_or_create(username="admin", defaults={"email": "admin@example.test"})
            user.is_staff = user.is_superuser = True
            user.set_password(secret)
            user.save()
            self.stdout.write(f"{'created' if created else 'updated'} admin (superuser) password {secret}")
