"""Wait until the database has every migration this code needs: ``manage.py wait_for_schema``.

Every Deployment that runs the app's code runs it as an initContainer (deploy/k8s; `make
validate-k8s` checks each has it), so a new version's pods start only once the migration Job
has applied its migrations, and the old ones keep serving meanwhile. It polls every
``--interval`` seconds, says what it waits for when that changes (and every 30 s), and gives
up after ``--timeout`` (TTS_SCHEMA_WAIT_SECONDS) with exit status 1: the pod's restart waits
again. A database that does not answer yet is waited for too.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from webapp.housekeeping.schema import set_session_timeout, unapplied_migrations

# How often a wait that has not changed is said again, in seconds.
REPEAT_SECONDS = 30.0


class Command(BaseCommand):
    help = "Wait until every migration of this code is applied (exit 1 after --timeout seconds)."
    # A start-up step: the main process runs the checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=None, help="seconds (TTS_SCHEMA_WAIT_SECONDS)")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between checks (5)")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = float(
            settings.TTS_SCHEMA_WAIT_SECONDS if options["timeout"] is None else options["timeout"]
        )
        interval = max(0.1, float(options["interval"]))
        connection = connections[options["database"]]
        deadline = time.monotonic() + timeout
        said, said_at = "", 0.0
        while True:
            try:
                # Each check is bounded too: a lock on django_migrations must not outlast the wait.
                set_session_timeout(connection, "statement_timeout", max(interval, 5.0))
                pending = unapplied_migrations(connection)
                why = f"{len(pending)} migration(s) not applied yet: {', '.join(pending)}"
            except DatabaseError as exc:
                pending = None
                why = f"the database does not answer: {str(exc).strip()}"
                connection.close()  # a new connection at the next check
            if pending == []:
                self.stdout.write("wait_for_schema: the schema is up to date")
                return
            now = time.monotonic()
            if now >= deadline:
                raise CommandError(
                    f"wait_for_schema: gave up after {timeout:g} s; {why} (the migration Job applies them: "
                    "docs/scaling.md, Upgrades)"
                )
            if why != said or now - said_at >= REPEAT_SECONDS:
                self.stderr.write(f"wait_for_schema: waiting (up to {timeout:g} s): {why}")
                said, said_at = why, now
            time.sleep(min(interval, deadline - now))
