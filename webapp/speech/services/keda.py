"""KEDA's signal for scaling a worker pool: queued + running jobs of one engine queue, in PostgreSQL.

The job rows are the backlog (the outbox): a message a worker prefetched has left the
Redis list, so the list's length under-counts, while the rows count every job waiting
for or held by a worker. KEDA's ``postgresql`` scaler runs :func:`backlog_query` for a
``ScaledObject``'s queue every polling interval; ``speech_job_engine_active_idx`` holds
only the active rows, so the count reads what is live, never the job history.

KEDA logs in as a role of its own that may read two columns of one table
(:func:`role_sql`): not the tenants' texts, not another table, and nothing writable.
Creating a role needs ``CREATEROLE``, which the app's role (owner of its database
only) does not have, so no migration creates it: ``manage.py keda_sql`` prints the
statements, run once by whoever administers the cluster (part 1) and by the app's
role (part 2, the grants on what it owns).
"""

from __future__ import annotations

import re

from webapp.speech.models import ACTIVE_STATUSES, SynthesisJob, sql_status_in
from webapp.speech.services.dispatch import queue_for_engine

INDEX = "speech_job_engine_active_idx"
ROLE = "tts_keda"
TABLE = SynthesisJob._meta.db_table
# The index's condition, as the query must state it for PostgreSQL to use the partial index.
ACTIVE_SQL = sql_status_in(ACTIVE_STATUSES)
# What KEDA may read: the columns the queries name (a count reads no other column).
COLUMNS = ("engine", "status", "lane")
INTERACTIVE_SQL = f"lane = '{SynthesisJob.Lane.INTERACTIVE}'"
_ENGINE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,49}$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def backlog_query(engine: str) -> str:
    """The count for ``engine``'s queue (``synth.<engine>``), with the engine as a literal (a
    scaler's query takes no parameters); ``engine`` must look like an engine name."""
    if not _ENGINE.match(engine):
        raise ValueError(f"{engine!r} is not an engine name like piper")
    return f"SELECT count(*) FROM {TABLE} WHERE engine = '{engine}' AND {ACTIVE_SQL}"


def interactive_query(engine: str) -> str:
    """The count of ``engine``'s interactive jobs in flight (queued or running): a pool's second
    trigger, so that agents' sessions and /v1/audio/speech requests scale it on their own count,
    with a smaller target than the whole backlog's (docs/scaling.md, "Interactive work")."""
    return f"{backlog_query(engine)} AND {INTERACTIVE_SQL}"


def role_sql(database: str, role: str = ROLE) -> str:
    """The psql script that creates KEDA's role (part 1) and grants it what it reads (part 2).

    The password is psql's variable ``keda_password`` (``psql -v keda_password=...``), so it
    is never written into a file. Read-only twice over: only SELECT on two columns is
    granted, and the role's transactions are read-only by default.
    """
    for name in (database, role):
        if not _IDENTIFIER.match(name):
            raise ValueError(f"{name!r} is not a plain PostgreSQL name")
    columns = ", ".join(COLUMNS)
    return f"""\
-- Part 1: as a role with CREATEROLE (the cluster's administrator), once.
CREATE ROLE {role} LOGIN PASSWORD :'keda_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION CONNECTION LIMIT 4;
ALTER ROLE {role} SET default_transaction_read_only = on;
ALTER ROLE {role} SET statement_timeout = '5s';

-- Part 2: as the app's role (the owner of database {database} and its tables), after migrations.
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT ({columns}) ON TABLE {TABLE} TO {role};
"""


def keda_sql(database: str, engines: list[str], role: str = ROLE) -> str:
    """The role's script, then each engine queue's query (what ``manage.py keda_sql`` prints)."""
    queries = "\n".join(
        f"-- {queue_for_engine(e)}\n{backlog_query(e)};\n-- {queue_for_engine(e)}, interactive\n"
        f"{interactive_query(e)};"
        for e in engines
    )
    return f"{role_sql(database, role)}\n-- KEDA's query per queue (postgresql trigger, index {INDEX}):\n{queries}\n"
