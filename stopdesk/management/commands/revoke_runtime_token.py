from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.config import require_migrated_database
from stopdesk.models import Runtime
from stopdesk.services.runtimes import runtime_revoke


class Command(BaseCommand):
    help = "Revoke an agent runtime's API token; its requests are refused from now on."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        require_migrated_database()
        runtime = Runtime.objects.filter(name=name).first()
        if runtime is None:
            raise CommandError(f"No runtime {name!r}.")
        if runtime_revoke(runtime=runtime, actor=f"cli:{getpass.getuser()}"):
            self.stdout.write(f"Revoked the token of {name!r}.")
        else:
            self.stdout.write(f"The token of {name!r} was already revoked.")
