"""Housekeeping of the sentence cache: each tenant's least recently used entries past its plan's bound,
then the whole cache's oldest past the operator's global cap.

Tenants are taken in turn from where the last run stopped (a cursor in Redis): a run that spends
its budget on the first tenants no longer leaves the later ones unevicted for ever.
"""

from __future__ import annotations

import uuid

import redis
from django.conf import settings

from webapp import redis_clients
from webapp.housekeeping.jobs import Context, job
from webapp.speech.services import sentence_cache
from webapp.tenants.models import Organization

CURSOR_KEY = "tts:housekeeping:cursor:evict_sentence_cache"


@job(
    "evict_sentence_cache",
    "Remove each tenant's least recently used sentence cache entries past its plan's sentence_cache_bytes "
    "and those unused for its text retention, "
    "then the oldest entries of all past TTS_SENTENCE_CACHE_MAX_BYTES, and the folders of tenants that are "
    "gone; record the bytes kept (counted in the tenant's storage), and a count of 0 for tenants with no "
    "folder.",
)
def evict_sentence_cache(ctx: Context) -> None:
    ids = [name for name in sentence_cache.tenants_with_entries() if _is_uuid(name)]
    ctx.add("phantom_counts_reset", sentence_cache.zero_tenants_without_entries(ids))
    rows = Organization.objects.filter(pk__in=ids).values_list(
        "pk", "plan__sentence_cache_bytes", "plan__text_retention_days"
    )
    bounds = {str(pk): int(bound) for pk, bound, _days in rows}
    # A cached sentence is the tenant's text, spoken: none outlives the plan's text retention.
    max_ages = {str(pk): None if days is None else days * 86400.0 for pk, _bound, days in rows}
    client = redis_clients.locks()
    for name in _from_cursor(ids, _load_cursor(client)):
        if ctx.out_of_time():
            return
        if name not in bounds:  # a tenant deleted while its purge could not run
            ctx.add("bytes_freed", sentence_cache.purge_tenant(name))
            ctx.add("tenants_gone")
        else:
            outcome = sentence_cache.evict(name, bounds[name], max_age=max_ages[name])
            ctx.add("removed", outcome.removed)
            ctx.add("bytes_freed", outcome.freed)
            ctx.add("bytes_kept", outcome.kept_bytes)
        _save_cursor(client, name)
    _save_cursor(client, None)  # every tenant had its turn: the next run starts from the first
    cap = settings.TTS_SENTENCE_CACHE_MAX_BYTES
    if cap > 0 and sentence_cache.bytes_recorded() > cap:
        outcome = sentence_cache.evict_oldest(cap)
        ctx.add("removed_over_cap", outcome.removed)
        ctx.add("bytes_freed", outcome.freed)


def _from_cursor(ids: list[str], after: str | None) -> list[str]:
    """The tenants in order, starting after the one the last run stopped at."""
    if after is None:
        return ids
    later = [name for name in ids if name > after]
    return later + [name for name in ids if name <= after]


def _load_cursor(client: redis.Redis) -> str | None:
    try:
        raw = client.get(CURSOR_KEY)
    except redis.RedisError:  # the run starts from the first tenant: more work, nothing wrong
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


def _save_cursor(client: redis.Redis, after: str | None) -> None:
    try:
        if after is None:
            client.delete(CURSOR_KEY)
        else:
            client.set(CURSOR_KEY, after)
    except redis.RedisError:
        pass


def _is_uuid(name: str) -> bool:
    try:
        uuid.UUID(name)
    except ValueError:
        return False
    return True
