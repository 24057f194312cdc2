"""Heartbeats are read through their index: two round trips however many keys Redis holds,
and a child whose beat expired leaves the index without taking a fresh beat with it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis_database import redis_database
from webapp.speech import heartbeat

UNRELATED_KEYS = 5_000


@pytest.fixture
def own_redis(stack: Any) -> Iterator[Any]:
    """A Redis database of its own: made-up beats reach no other test, and it can be emptied."""
    with redis_database(stack, 13) as r:
        yield r


def _calls(r: Any) -> dict[str, int]:
    """Commands run since the last CONFIG RESETSTAT, by name (the reset itself left out)."""
    stats = r.info("commandstats").items()
    return {name: int(stat["calls"]) for name, stat in stats if not name.startswith("cmdstat_config")}


def test_a_reader_costs_two_round_trips_however_many_keys_redis_holds(own_redis: Any) -> None:
    r = own_redis
    for start in range(0, UNRELATED_KEYS, 1_000):  # rate-limit counters, cache entries, queues...
        r.mset({f"other:{i}": "x" for i in range(start, start + 1_000)})
    heartbeat.publish("host-a:1", {"worker_id": "host-a:1", "state": "ready"}, ttl=30)
    heartbeat.publish("host-b:2", {"worker_id": "host-b:2", "state": "ready"}, ttl=30)
    r.config_resetstat()
    beats = heartbeat.live_workers()
    calls = _calls(r)
    assert sorted(b["worker_id"] for b in beats) == ["host-a:1", "host-b:2"]
    assert "cmdstat_scan" not in calls  # a SCAN took 25 round trips here
    assert calls == {"cmdstat_smembers": 1, "cmdstat_mget": 1}


def test_a_child_whose_beat_expired_leaves_the_index(own_redis: Any) -> None:
    r = own_redis
    heartbeat.publish("gone:1", {"worker_id": "gone:1", "state": "ready"}, ttl=30)
    heartbeat.publish("live:2", {"worker_id": "live:2", "state": "ready"}, ttl=30)
    r.delete(heartbeat.KEY_PREFIX + "gone:1")  # its TTL ran out: the child was killed
    assert [b["worker_id"] for b in heartbeat.live_workers()] == ["live:2"]
    assert r.smembers(heartbeat.INDEX_KEY) == {"live:2"}
    heartbeat.remove("live:2")  # a child that leaves cleanly takes its entry with it
    assert heartbeat.live_workers() == []
    assert not r.exists(heartbeat.INDEX_KEY)


def test_a_beat_that_comes_back_before_the_prune_keeps_its_entry(own_redis: Any) -> None:
    r = own_redis
    heartbeat.publish("slow:1", {"worker_id": "slow:1", "state": "ready"}, ttl=30)
    # A reader saw the beat missing, then the child beat again before the reader pruned:
    # the prune looks at the key itself, at that moment, and leaves the entry.
    removed = r.eval(
        heartbeat._PRUNE_SCRIPT, 2, heartbeat.INDEX_KEY, heartbeat.KEY_PREFIX + "slow:1", "slow:1"
    )
    assert removed == 0
    assert [b["worker_id"] for b in heartbeat.live_workers()] == ["slow:1"]
