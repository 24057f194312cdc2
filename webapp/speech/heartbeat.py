"""Worker heartbeats in Redis: one key per worker child, refreshed with a TTL.

Readers (healthz, the admin console, submit's no_worker check, every ETA) only
see children that beat within the TTL, on any host. A set (``INDEX_KEY``) lists
the children that have beaten, so a reader costs two round trips however many
other keys Redis holds (a SCAN of the keyspace cost one per 200 keys, on every
/healthz and submit); a child whose beat has expired leaves the set on the next read.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django.conf import settings

from webapp import redis_clients

KEY_PREFIX = "tts:heartbeat:"
INDEX_KEY = "tts:heartbeats"

# KEYS: the index, then one beat key per id in ARGV. An id leaves the index only
# if its beat key is gone at that moment: a child that beats between a reader's
# MGET and this script keeps its entry.
_PRUNE_SCRIPT = """
local removed = 0
for i, id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    removed = removed + redis.call('SREM', KEYS[1], id)
  end
end
return removed
"""


def publish(worker_id: str, data: dict[str, Any], ttl: int | None = None) -> None:
    pipe = redis_clients.heartbeats().pipeline(transaction=False)
    pipe.set(KEY_PREFIX + worker_id, json.dumps(data), ex=ttl or settings.TTS_HEARTBEAT_TTL)
    pipe.sadd(INDEX_KEY, worker_id)
    pipe.execute()


def remove(worker_id: str) -> None:
    pipe = redis_clients.heartbeats().pipeline(transaction=False)
    pipe.delete(KEY_PREFIX + worker_id)
    pipe.srem(INDEX_KEY, worker_id)
    pipe.execute()


def live_workers() -> list[dict[str, Any]]:
    r = redis_clients.heartbeats()
    ids = sorted(cast(set[str], r.smembers(INDEX_KEY)))
    if not ids:
        return []
    keys = [KEY_PREFIX + worker_id for worker_id in ids]
    out = []
    expired = []
    for worker_id, raw in zip(ids, cast(list[str | None], r.mget(keys)), strict=True):
        if raw is None:
            expired.append(worker_id)
            continue
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    if expired:
        r.eval(_PRUNE_SCRIPT, 1 + len(expired), INDEX_KEY, *(KEY_PREFIX + i for i in expired), *expired)
    return out


# "recycling": a child that is being replaced after its task; its node serves
# again within a second or two, so a submit then must not be a 503 no_worker.
SERVING_STATES = ("ready", "recycling")


def serving_voices(workers: list[dict[str, Any]] | None = None) -> set[str]:
    """The voices live children serve (``workers``: heartbeats already read, else read now)."""
    voices: set[str] = set()
    for w in live_workers() if workers is None else workers:
        if w.get("state") in SERVING_STATES:
            voices.update(w.get("voices", []))
    return voices
