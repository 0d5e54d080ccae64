"""Exercise the stop path before release: each drill against each configured mechanism.

    python manage.py stopdrill                       # every drill, every mechanism, on the sandbox
    python manage.py stopdrill --drill duplicate_stop --mechanism openai
    python manage.py stopdrill --write-reliability   # and write docs/RELIABILITY.md from this run

Prints the table (drill, mechanism, expected, observed, pass or fail, each item's final state),
stores the run (reconcile.DrillRun), and exits non-zero if any drill failed.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from reconcile.drills import reliability
from reconcile.drills.catalogue import BY_NAME
from reconcile.drills.runner import Outcome, run_drills
from reconcile.drills.table import table


class Command(BaseCommand):
    help = "Run the stop drills against each mechanism on the sandbox and print what happened."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--drill", action="append", choices=sorted(BY_NAME), help="Only this drill (repeatable).")
        parser.add_argument("--mechanism", action="append", help="Only this mechanism (repeatable).")
        parser.add_argument("--no-store", action="store_true", help="Do not keep the run in the database.")
        parser.add_argument("--brief", action="store_true", help="Leave out the per-item lines.")
        parser.add_argument(
            "--write-reliability",
            nargs="?",
            const=str(Path(settings.BASE_DIR) / "docs" / "RELIABILITY.md"),
            metavar="PATH",
            help="Write docs/RELIABILITY.md (or PATH) from this run.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(outcome: Outcome) -> None:
            self.stderr.write(f"  {outcome.verdict:4}  {outcome.drill} / {outcome.mechanism}  ({outcome.seconds}s)")

        # A parked `hang` request is cancelled when the sandbox stops; uvicorn logs that as an
        # error, which is the fault working as intended, not news.
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
        report = run_drills(
            drills=options["drill"],
            mechanisms=options["mechanism"],
            store=not options["no_store"],
            progress=progress,
        )
        self.stdout.write(table(report, items=not options["brief"]))
        if report.run is not None:
            self.stdout.write(f"Stored as drill run #{report.run.pk}.")
        if options["write_reliability"]:
            # The environment that chose the database and broker is part of the command.
            env = [
                f"{name}={re.sub(r'://([^:@/]+):[^@/]*@', r'://\1:***@', os.environ[name])}"
                for name in ("DATABASE_URL", "CELERY_BROKER_URL")
                if os.environ.get(name)
            ]
            command = shlex.join([*env, "python", "manage.py", "stopdrill", *sys.argv[2:]])
            path = reliability.write(report, Path(options["write_reliability"]), command=command)
            self.stdout.write(f"Wrote {path}.")
        if not report.passed:
            raise CommandError("Stop did not hold in every drill; see FAIL rows above.", returncode=1)
