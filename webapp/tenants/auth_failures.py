"""A small budget of failed API-key authentications per client address, counted in Redis.

Nginx lets requests that carry credentials past its strict per-address zones
on the API (a paying customer's backend sends everything from one address),
and it cannot tell a real key from ``Authorization: x`` or a forged
``tts_AAAAAAAA_…``: each costs the sender nothing. So Django counts the
failures: each request whose credentials do not authenticate adds one to its
address's counter, which lives ``TTS_AUTH_FAILURE_WINDOW_SECONDS`` from the
first failure (a fixed window, every web process and node on one counter).
Once ``TTS_AUTH_FAILURES_PER_IP`` failures are counted, every request from
that address whose credentials fail is answered ``429 too_many_auth_failures``
with ``Retry-After`` until the window ends, instead of 401. A valid key is never
refused for what others sent from its address (one NAT can hold every tenant,
and one stranger's junk would lock them all out): the key is looked up first,
and only a failure meets the budget. What that costs a flood is one indexed
lookup by the key's prefix per well-formed token (a malformed header costs
none); telling a guesser that a guess was right tells nothing a 256-bit secret
lets anyone guess. Requests without credentials are not affected (Nginx's
anonymous zones limit those).

If Redis cannot count, authentication goes on uncounted: refusing every key
while Redis restarts would fail every tenant's requests.
"""

from __future__ import annotations

import logging

from django.conf import settings
from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.errors import DomainError, ErrorCode

log = logging.getLogger(__name__)

# KEYS[1] the address's counter; ARGV[1] the window (s). Returns the count, the window starting
# with the first failure.
_RECORD = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return count
"""


def key(address: str) -> str:
    return f"tts:authfail:{address}"


def _enabled() -> bool:
    return int(settings.TTS_AUTH_FAILURES_PER_IP) > 0


def refuse_if_spent(address: str | None) -> None:
    """429 ``too_many_auth_failures`` when this address has used its budget of failures."""
    if address is None or not _enabled():
        return
    budget = int(settings.TTS_AUTH_FAILURES_PER_IP)
    try:
        pipe = redis_clients.heartbeats().pipeline(transaction=False)
        pipe.get(key(address))
        pipe.ttl(key(address))
        raw_count, ttl = pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("failed authentications not counted (Redis away): %s", exc)
        return
    if raw_count is None or int(raw_count) < budget:
        return
    retry_after = max(1, int(ttl))
    raise DomainError(
        ErrorCode.TOO_MANY_AUTH_FAILURES,
        f"{budget} requests from this address failed authentication; every request with "
        f"credentials from it is refused for {retry_after} s.",
        retry_after=retry_after,
    )


def record_failure(address: str | None) -> None:
    """Count one failed authentication against the address."""
    if address is None or not _enabled():
        return
    window = max(1, int(settings.TTS_AUTH_FAILURE_WINDOW_SECONDS))
    try:
        redis_clients.heartbeats().eval(_RECORD, 1, key(address), window)
    except (RedisError, OSError) as exc:
        log.warning("failed authentication not counted (Redis away): %s", exc)
