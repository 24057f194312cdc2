"""Worker heartbeats in Redis: one key per worker child, refreshed with a TTL.

Readers (healthz, the admin console, submit's no_worker check) only see
children that beat within the TTL, on any host.
"""

from __future__ import annotations

import json
from typing import Any, cast

import redis
from django.conf import settings

KEY_PREFIX = "tts:heartbeat:"

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=3, decode_responses=True
        )
    return _client


def publish(worker_id: str, data: dict[str, Any], ttl: int | None = None) -> None:
    client().set(KEY_PREFIX + worker_id, json.dumps(data), ex=ttl or settings.TTS_HEARTBEAT_TTL)


def remove(worker_id: str) -> None:
    client().delete(KEY_PREFIX + worker_id)


def live_workers() -> list[dict[str, Any]]:
    r = client()
    keys = list(r.scan_iter(match=KEY_PREFIX + "*", count=200))
    if not keys:
        return []
    out = []
    for raw in cast(list[str | None], r.mget(keys)):
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out


# "recycling": a child that is being replaced after its task; its node serves
# again within a second or two, so a submit then must not be a 503 no_worker.
SERVING_STATES = ("ready", "recycling")


def serving_voices() -> set[str]:
    voices: set[str] = set()
    for w in live_workers():
        if w.get("state") in SERVING_STATES:
            voices.update(w.get("voices", []))
    return voices
