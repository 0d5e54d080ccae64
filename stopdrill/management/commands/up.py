"""`manage.py up` (what `make run` calls): the web app, a Celery worker with beat, the sandbox and a
demo task, on SQLite and a folder broker unless DATABASE_URL / CELERY_BROKER_URL say otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from stopdrill.launcher import Launcher, free_port


class Command(BaseCommand):
    help = "Run stopdesk locally: web, worker and beat, the sandbox parties, and a demo task. Ctrl-C stops all."
    requires_system_checks: list[str] = []  # the launcher's preflight says what is wrong, in one line

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to serve on (default 127.0.0.1).")
        parser.add_argument("--port", type=int, default=8000, help="Web port (default 8000; 0 picks a free one).")
        parser.add_argument(
            "--data-dir",
            default="",
            help="Folder for SQLite, the local broker and logs (default $STOPDESK_DATA_DIR or ./var).",
        )
        parser.add_argument("--no-demo", action="store_true", help="Do not start a demo task.")
        parser.add_argument(
            "--sandbox-port", type=int, default=None, help="First of four sandbox ports (default: web port + 1)."
        )
        parser.add_argument("--concurrency", type=int, default=8, help="Worker threads (default 8).")
        parser.add_argument("--pace", type=float, default=15.0, help="Seconds between the demo's stages (default 15).")

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir = options["data_dir"]
        if data_dir and Path(data_dir).resolve() != Path(settings.DATA_DIR).resolve():
            # Settings read STOPDESK_DATA_DIR when they load, which has already happened: start again
            # with it set, so this process and its children agree on one folder.
            os.environ["STOPDESK_DATA_DIR"] = str(Path(data_dir).resolve())
            os.execv(sys.executable, [sys.executable, *sys.argv])  # noqa: S606 - our own command line
        launcher = Launcher(
            host=options["host"],
            port=options["port"] or free_port(),
            demo=not options["no_demo"],
            sandbox_base_port=options["sandbox_port"],
            concurrency=options["concurrency"],
            pace=options["pace"],
            out=self.say,
        )
        sys.exit(launcher.run())

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
