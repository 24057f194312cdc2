"""Voice-prompt decodes bounded: a per-tenant upload rate, and decode slots per tenant and per host.

Each upload starts a decode child (``synth.prompt.prepare_prompt``: up to
``TTS_PROMPT_DECODE_TIMEOUT_SECONDS`` of CPU and ``TTS_PROMPT_DECODE_MEMORY_MB``).
Unbounded, a burst of uploads was a pile of children that took the web tier's
CPU from every other request. Here, counted in Redis so every web process of
every host sees the same numbers:

* the tenant's **upload rate** (``TTS_VOICE_UPLOADS_PER_MINUTE``): every upload
  counts, refused ones too (a refused file costs a decode as well, and never
  counts against ``max_voices``); over it, ``429 rate_limited``;
* the tenant's **uploads in progress**, waiting or decoding, on all hosts
  (``TTS_PROMPT_DECODES_PER_TENANT``); over it, ``429 too_many_uploads``;
* the host's **decode slots** (``TTS_PROMPT_DECODES_PER_HOST``, the host is
  ``socket.gethostname()``, shared by every web process on it) and a **queue** in
  front of them (``TTS_PROMPT_DECODE_QUEUE`` places beyond the uploads decoding,
  first come first served). A full
  queue, or a wait past ``TTS_PROMPT_DECODE_WAIT_SECONDS``, is ``503 decoder_busy``;
  no upload waits longer than that.

The decode child runs at a lower priority (``TTS_PROMPT_DECODE_NICE``, given to
``synth.prompt``'s launch), so the decodes that are admitted yield the CPU to requests.

Every member is a token in a sorted set, scored by the time it must be gone by
(Redis's clock): a web process killed while it waits or decodes never gives its
slot back, and the slot comes back when its score passes. The waiting upload
sleeps in its request's thread (a sync view's own thread under ASGI, never the
event loop), for at most the stated bound.

If Redis cannot count, an upload is refused (503, Retry-After): a decode the
bounds could not see is what this module exists to prevent.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.errors import DomainError, ErrorCode

log = logging.getLogger(__name__)


RATE_WINDOW_SECONDS = 60
# Past its bound (its wait, or its decode's timeout), a member stays this long before it counts as leaked.
MARGIN_SECONDS = 10
# How often a waiting upload asks whether its turn has come.
POLL_SECONDS = 0.1
UNAVAILABLE_RETRY_AFTER = 5

# KEYS[1] the tenant's rate window. ARGV: window (s). Returns (count, seconds left in the window).
_COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('TTL', KEYS[1])
if ttl < 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {n, ttl}
"""

# KEYS: tenant set, host queue, host decode slots. ARGV: tenant cap, slots, queue places, tenant
# lifetime (ms), queue lifetime (ms), token. Returns 1 queued, 0 the tenant's uploads are at its
# cap, -1 the host's decoders are busy and its queue full.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
local host = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
if host >= tonumber(ARGV[2]) + tonumber(ARGV[3]) then return -1 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
-- The queue is scored by arrival (first come first served); a member older than its lifetime is gone.
redis.call('ZADD', KEYS[2], now, ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""

# KEYS: host queue, host decode slots. ARGV: slots, queue lifetime (ms), decode lifetime (ms), token.
# Returns 1 the slot is taken, 0 not yet, -1 the token left the queue (aged out).
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local rank = redis.call('ZRANK', KEYS[1], ARGV[4])
if not rank then return -1 end
if rank >= tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""


def host() -> str:
    return socket.gethostname()


def rate_key(organization_id: Any) -> str:
    return f"tts:uploads:rate:{organization_id}"


def tenant_key(organization_id: Any) -> str:
    return f"tts:uploads:tenant:{organization_id}"


def queue_key(host_name: str) -> str:
    return f"tts:decodes:queue:{host_name}"


def slots_key(host_name: str) -> str:
    return f"tts:decodes:slots:{host_name}"


def _unavailable(exc: BaseException) -> DomainError:
    log.warning("voice upload refused, its bounds cannot be counted (Redis away): %s", exc)
    return DomainError(
        ErrorCode.SERVICE_UNAVAILABLE,
        "Uploads cannot be admitted right now; try again shortly.",
        retry_after=UNAVAILABLE_RETRY_AFTER,
    )


def _busy(detail: str) -> DomainError:
    return DomainError(
        ErrorCode.DECODER_BUSY,
        f"{detail}; try again in a few seconds.",
        retry_after=max(1, math.ceil(settings.TTS_PROMPT_DECODE_WAIT_SECONDS)),
    )


def count_upload(organization_id: Any) -> None:
    """Count one upload against the tenant's rate; ``429 rate_limited`` (Retry-After) over it."""
    limit = int(settings.TTS_VOICE_UPLOADS_PER_MINUTE)
    try:
        count, left = redis_clients.locks().eval(_COUNT, 1, rate_key(organization_id), RATE_WINDOW_SECONDS)
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from exc
    if int(count) > limit:
        wait = max(1, int(left))
        raise DomainError(
            ErrorCode.RATE_LIMITED,
            f"More than {limit} voice uploads in a minute for this tenant; try again in {wait} s.",
            retry_after=wait,
            extra={"limit": "voice_uploads_per_minute", "voice_uploads_per_minute": limit},
        )


def _lifetimes_ms() -> tuple[int, int, int]:
    """(queue, decode, tenant) lifetimes of a member: its bound plus the margin."""
    wait = float(settings.TTS_PROMPT_DECODE_WAIT_SECONDS) + MARGIN_SECONDS
    decode = float(settings.TTS_PROMPT_DECODE_TIMEOUT_SECONDS) + MARGIN_SECONDS
    return int(wait * 1000), int(decode * 1000), int((wait + decode) * 1000)


def _enter(organization_id: Any, host_name: str, token: str) -> None:
    queue_ms, _, tenant_ms = _lifetimes_ms()
    per_tenant = int(settings.TTS_PROMPT_DECODES_PER_TENANT)
    slots, places = int(settings.TTS_PROMPT_DECODES_PER_HOST), int(settings.TTS_PROMPT_DECODE_QUEUE)
    args = (per_tenant, slots, places, tenant_ms, queue_ms, token)
    keys = (tenant_key(organization_id), queue_key(host_name), slots_key(host_name))
    try:
        entered = int(redis_clients.locks().eval(_ENTER, 3, *keys, *args))
    except (RedisError, OSError) as exc:
        raise _unavailable(exc) from exc
    if entered == 0:
        raise DomainError(
            ErrorCode.TOO_MANY_UPLOADS,
            f"{per_tenant} of {per_tenant} voice uploads of this tenant are being read; "
            "send the next when one is answered.",
            retry_after=max(1, math.ceil(settings.TTS_PROMPT_DECODE_TIMEOUT_SECONDS / 4)),
            extra={"limit": "concurrent_uploads", "concurrent_uploads": per_tenant},
        )
    if entered < 0:
        raise _busy("Every voice decoder of this server is busy and its queue is full")


def _take(host_name: str, token: str) -> None:
    """Wait in the queue for a decode slot, at most TTS_PROMPT_DECODE_WAIT_SECONDS."""
    queue_ms, decode_ms, _ = _lifetimes_ms()
    args = (int(settings.TTS_PROMPT_DECODES_PER_HOST), queue_ms, decode_ms, token)
    keys = (queue_key(host_name), slots_key(host_name))
    deadline = time.monotonic() + float(settings.TTS_PROMPT_DECODE_WAIT_SECONDS)
    while True:
        try:
            taken = int(redis_clients.locks().eval(_TAKE, 2, *keys, *args))
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc
        if taken > 0:
            return
        left = deadline - time.monotonic()
        if taken < 0 or left <= 0:
            raise _busy(
                f"No voice decoder of this server came free within "
                f"{settings.TTS_PROMPT_DECODE_WAIT_SECONDS:g} s"
            )
        time.sleep(min(POLL_SECONDS, left))


def _leave(organization_id: Any, host_name: str, token: str) -> None:
    try:
        pipe = redis_clients.locks().pipeline(transaction=False)
        pipe.zrem(queue_key(host_name), token)
        pipe.zrem(slots_key(host_name), token)
        pipe.zrem(tenant_key(organization_id), token)
        pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("decode slot not given back (it ages out): %s", exc)


@contextlib.contextmanager
def decode_slot(organization_id: Any) -> Iterator[None]:
    """Hold one of the tenant's uploads in progress and one of this host's decode slots.

    Raises ``too_many_uploads`` (429) or ``decoder_busy`` (503), each with
    Retry-After; the slots are given back however the block ends.
    """
    host_name = host()
    token = uuid.uuid4().hex
    _enter(organization_id, host_name, token)
    try:
        _take(host_name, token)
        yield
    finally:
        _leave(organization_id, host_name, token)


def in_use(organization_id: Any | None = None, host_name: str | None = None) -> dict[str, int]:
    """What is counted now (expired members included until the next call ages them out): for tests, metrics."""
    client = redis_clients.locks()
    name = host_name or host()
    counts = {"decoding": int(client.zcard(slots_key(name))), "queued": int(client.zcard(queue_key(name)))}
    if organization_id is not None:
        counts["tenant"] = int(client.zcard(tenant_key(organization_id)))
    return counts
