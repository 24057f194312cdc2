"""Django's ``migrate``, with a bounded wait for each lock: ``manage.py migrate``.

Every place migrations run goes through it: the migration Job on Kubernetes, ``make run``'s
provisioning (deploy/provision.py), the test suite. A migration that alters a table waits for
its ACCESS EXCLUSIVE lock behind every transaction that touched the table, and meanwhile every
other query of that table waits behind the migration: one long report or a stuck session then
stalls the whole service. With PostgreSQL's ``lock_timeout`` (TTS_MIGRATION_LOCK_TIMEOUT) the
migration gives up instead, its transaction rolls back, and the command exits 1 naming it; the
Job's retry (or the operator's) runs it again.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import DatabaseError, connections
from django.db.migrations import Migration

from webapp.housekeeping.schema import is_lock_timeout, set_session_timeout


class Command(DjangoMigrate):
    help = DjangoMigrate.help + " Waits TTS_MIGRATION_LOCK_TIMEOUT seconds at most for each lock."

    running: Migration | None = None

    def migration_progress_callback(self, action: str, migration: Any = None, fake: bool = False) -> None:
        if action in ("apply_start", "unapply_start"):
            self.running = migration  # named if it gives up on a lock
        super().migration_progress_callback(action, migration, fake)

    def handle(self, *args: Any, **options: Any) -> None:
        timeout = float(settings.TTS_MIGRATION_LOCK_TIMEOUT)
        connection = connections[options["database"]]
        if timeout > 0:
            # For the session: each migration runs in a transaction of its own on this connection.
            set_session_timeout(connection, "lock_timeout", timeout)
        try:
            super().handle(*args, **options)
        except DatabaseError as exc:
            if not is_lock_timeout(exc):
                raise
            what = f"{self.running.app_label}.{self.running.name}" if self.running else "the migrations"
            raise CommandError(
                f"{what} gave up after the lock_timeout of {timeout:g} s (TTS_MIGRATION_LOCK_TIMEOUT): "
                f"another session holds a lock on a table it changes ({str(exc).strip()}). Its "
                "transaction rolled back; the migrations before it stay applied. Run migrate again "
                "(the migration Job retries by itself), or first end the long transaction: "
                "SELECT pid, xact_start, state, query FROM pg_stat_activity WHERE xact_start IS NOT NULL "
                "ORDER BY xact_start"
            ) from None
