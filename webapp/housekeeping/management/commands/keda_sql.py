"""Print KEDA's role and queries: ``manage.py keda_sql [--engine piper ...] [--role tts_keda]``.

KEDA scales each worker Deployment on its queue's queued + running jobs, read by a
role that may read nothing else (webapp/speech/services/keda.py). The app's role
cannot create roles, so this prints the psql script instead of running it: part 1
for the cluster's administrator, part 2 for the app's role, then one query per
engine queue for the ``ScaledObject``'s ``postgresql`` trigger. It reads no database.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.speech.services import keda


class Command(BaseCommand):
    help = "Print the SQL for KEDA's read-only role and each engine queue's backlog query."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--engine",
            action="append",
            dest="engines",
            help="an engine whose queue KEDA scales (repeat it); default: TTS_WORKER_ENGINES",
        )
        parser.add_argument("--role", default=keda.ROLE, help=f"KEDA's login role (default {keda.ROLE})")
        parser.add_argument("--query-only", action="store_true", help="print only the query (one engine)")

    def handle(self, *args: Any, **options: Any) -> None:
        engines: list[str] = options["engines"] or list(settings.TTS_WORKER_ENGINES)
        database = str(settings.DATABASES["default"]["NAME"])
        try:
            if options["query_only"]:
                if len(engines) != 1:
                    raise CommandError("--query-only takes exactly one --engine")
                self.stdout.write(keda.backlog_query(engines[0]))
                return
            self.stdout.write(keda.keda_sql(database, engines, options["role"]), ending="")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
