"""Housekeeping of the sentence cache: each tenant's least recently used entries past its plan's bound."""

from __future__ import annotations

import uuid

from webapp.housekeeping.jobs import Context, job
from webapp.speech.services import sentence_cache
from webapp.tenants.models import Organization


@job(
    "evict_sentence_cache",
    "Remove each tenant's least recently used sentence cache entries past its plan's sentence_cache_bytes, "
    "and the folders of tenants that are gone; record the bytes kept (counted in the tenant's storage).",
)
def evict_sentence_cache(ctx: Context) -> None:
    folders = sentence_cache.tenants_with_entries()
    ids = [name for name in folders if _is_uuid(name)]
    rows = Organization.objects.filter(pk__in=ids).values_list("pk", "plan__sentence_cache_bytes")
    bounds = {str(pk): int(bound) for pk, bound in rows}
    for name in ids:
        if ctx.out_of_time():
            return
        if name not in bounds:  # a tenant deleted while its purge could not run
            ctx.add("bytes_freed", sentence_cache.purge_tenant(name))
            ctx.add("tenants_gone")
            continue
        outcome = sentence_cache.evict(name, bounds[name])
        ctx.add("removed", outcome.removed)
        ctx.add("bytes_freed", outcome.freed)
        ctx.add("bytes_kept", outcome.kept_bytes)


def _is_uuid(name: str) -> bool:
    try:
        uuid.UUID(name)
    except ValueError:
        return False
    return True
