"""The schema a process's code needs, and migrations that give up on a lock instead of queueing.

``manage.py migrate`` (webapp/housekeeping/management/commands/migrate.py) sets PostgreSQL's
``lock_timeout`` from TTS_MIGRATION_LOCK_TIMEOUT; ``manage.py wait_for_schema`` (every app
pod's initContainer on Kubernetes) waits until :func:`unapplied_migrations` is empty.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

# PostgreSQL's SQLSTATE for a lock not granted within lock_timeout (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"


def unapplied_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """``app.name`` of each migration this code has that the database has not applied, in order
    (what ``migrate --check`` fails on); a migration the database has and this code lacks (a newer
    version's, during a rolling update) is no reason to wait."""
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


def set_session_timeout(connection: BaseDatabaseWrapper, name: str, seconds: float) -> None:
    """Set ``lock_timeout`` or ``statement_timeout`` for the rest of ``connection``'s session
    (0: no limit, as PostgreSQL reads it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, %s, false)", [name, str(round(seconds * 1000))])


def is_lock_timeout(exc: BaseException) -> bool:
    """``exc`` (Django's error, psycopg's as its cause) is a lock not granted within lock_timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
        seen = seen.__cause__
    return False
