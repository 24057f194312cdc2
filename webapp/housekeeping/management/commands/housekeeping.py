"""Run housekeeping jobs by hand: ``manage.py housekeeping expire_audio``.

``--list`` shows the jobs, ``--all`` runs every one. A run takes the same
Redis lock as the scheduled task, so it never overlaps a beat run; it says
"skipped" when one holds the lock.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.housekeeping.catalog import JOBS, run_job


class Command(BaseCommand):
    help = "Run housekeeping jobs now (the same ones Celery beat schedules)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("jobs", nargs="*", metavar="JOB", help="job names; see --list")
        parser.add_argument("--list", action="store_true", help="list the jobs and exit")
        parser.add_argument("--all", action="store_true", help="run every job")
        parser.add_argument(
            "--batch", type=int, default=None, help="rows/files per batch (TTS_HOUSEKEEPING_BATCH)"
        )
        parser.add_argument(
            "--budget",
            type=float,
            default=None,
            help="seconds a job may work before stopping between batches",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            width = max(len(name) for name in JOBS)
            for name, spec in sorted(JOBS.items()):
                self.stdout.write(f"{name:<{width}}  {spec.description}")
            return
        names: list[str] = sorted(JOBS) if options["all"] else options["jobs"]
        if not names:
            raise CommandError("name one or more jobs, or --all; --list shows them")
        unknown = [n for n in names if n not in JOBS]
        if unknown:
            raise CommandError(f"unknown job(s): {', '.join(unknown)}; known: {', '.join(sorted(JOBS))}")
        if options["batch"] is not None and options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        for name in names:
            result = run_job(name, batch=options["batch"], budget_seconds=options["budget"])
            self.stdout.write(result.summary())
