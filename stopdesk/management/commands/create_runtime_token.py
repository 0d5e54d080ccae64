from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.config import require_migrated_database
from stopdesk.models import Runtime
from stopdesk.services.runtimes import runtime_create, runtime_rotate


class Command(BaseCommand):
    help = "Create an agent runtime and print its API token (shown once; only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The runtime's name, e.g. invoices-agent.")
        parser.add_argument("--rotate", action="store_true", help="Give an existing runtime a new token.")
        parser.add_argument("--quiet", action="store_true", help="Print only the token (for scripts).")

    def handle(self, *args: Any, name: str, rotate: bool, quiet: bool, **options: Any) -> None:
        require_migrated_database()
        actor = f"cli:{getpass.getuser()}"
        existing = Runtime.objects.filter(name=name).first()
        if existing is not None and rotate:
            runtime, token = existing, runtime_rotate(runtime=existing, actor=actor)
        elif existing is not None:
            raise CommandError(f"Runtime {name!r} exists; use --rotate to give it a new token.")
        else:
            runtime, token = runtime_create(name=name, actor=actor)
        if quiet:
            self.stdout.write(token)
            return
        self.stdout.write(f"Runtime {runtime.name!r}: its token is shown once, store it now.")
        self.stdout.write(token)
