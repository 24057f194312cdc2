"""The tenant lock: the one way any transaction locks a tenant's row, in a named mode.

Every change of what a tenant counts or owns (a submit and its reservation, a settlement, a
voice, a dictionary and its pins, a webhook endpoint's count, a recount of its usage) takes the
tenant's row first, so checks of a limit and the write they allow cannot interleave, and the
lock order is one (docs/decisions.md, "Usage periods are locked per tenant row"): a job row,
then its tenant row, then the usage period row.

- ``WRITE``: ``FOR NO KEY UPDATE``. Not ``FOR UPDATE``: Django checks foreign keys at COMMIT
  with a KEY SHARE lock on the tenant row (a new job's, voice's, endpoint's), which FOR UPDATE
  would block while its holder waits for a row the committer holds.
- ``DELETE``: ``FOR UPDATE``, for the one transaction that removes the row (the operator's
  tenant deletion): it must exclude those KEY SHARE lockers too.

Only the tenant row is locked, never its plan's (``OF o``): a plan row locked would serialise
every tenant on the plan. ``tests/unit/test_conventions.py`` fails when a module outside this
one locks a tenant row.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.db import connection

from webapp.rawrows import columns, fetch_one
from webapp.tenants.models import Organization, Plan


class Mode(StrEnum):
    WRITE = "FOR NO KEY UPDATE"
    DELETE = "FOR UPDATE"


def lock_tenant(organization_id: Any, mode: Mode = Mode.WRITE) -> Organization:
    """The tenant row (with its plan, read, not locked), locked for this transaction.

    Written once with webapp/rawrows.py: every submit runs it.
    """
    o, p = columns(Organization, "o"), columns(Plan, "p")
    row = fetch_one(
        f"SELECT {o.sql}, {p.sql} FROM {o.table} JOIN {p.table} ON p.id = o.plan_id "
        f"WHERE o.id = %s {mode.value} OF o",
        [organization_id],
    )
    if row is None:
        raise Organization.DoesNotExist(f"no tenant {organization_id}")
    organization: Organization = o.build(row)
    organization.plan = p.build(row, len(o))
    return organization


def hold_tenant(organization_id: Any, mode: Mode = Mode.WRITE) -> bool:
    """The tenant row locked for this transaction, without reading it (a settlement needs only the
    lock). False if there is no such tenant."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Organization._meta.db_table} WHERE id = %s {mode.value}", [organization_id]
        )
        return cursor.fetchone() is not None
