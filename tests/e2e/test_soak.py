"""The soak of tests/bench/bench_soak.py, 500 jobs: nothing lost or charged twice while parts are killed,
no OpenAI client that left charged past what it received, no tenant's webhooks delayed by another's
dead receiver, and streams that fail partway charged what they handed."""

from __future__ import annotations

import pytest

from tests.bench.bench_soak import ROOT, run_soak


@pytest.mark.slow
def test_500_jobs_survive_killed_children_redis_and_postgres() -> None:
    result = run_soak(500, kill_every=100, var=ROOT / "var" / "test-soak")
    print("\n".join(result.lines()))  # whole, where an assertion's message is cut short
    assert result.child_kills >= 3, result.lines()
    assert result.lost == 0, result.lines()
    assert result.charged_twice == 0, result.lines()
    assert result.not_succeeded == {}, result.lines()
    assert result.bad_files == [], result.lines()
    # OpenAI clients that left at random: none charged past the sentences its connection received,
    # but for audio still in transit past the web process as it left (IN_TRANSIT_BYTES).
    assert result.leavers >= 5, result.lines()
    assert result.leavers_charged_beyond_transit == [], result.lines()
    # Beside it: a receiver that never answers delays no other tenant's events, and streams that
    # fail partway pay for the sentences they handed.
    side = result.side
    assert side.hook_jobs >= 10 and side.hook_events == side.hook_jobs, result.lines()
    assert sorted(side.hook_latencies)[len(side.hook_latencies) // 2] < 2.0, result.lines()
    assert side.black_hole_attempts > 0 and side.black_hole_delivered == 0, result.lines()
    assert side.failing_jobs >= 4 and side.charged_other_than_handed() == [], result.lines()
    assert side.failed_after_streaming() >= 1, result.lines()
    # Memory stays flat: the worker (parent and loaded children) grows at most 10 % from
    # its size after 100 jobs. Not two-sided: a child recycled or killed near the end has
    # run few jobs and is smaller than the one it replaced, which is no leak.
    assert result.rss_after_100_mb > 0, result.lines()
    assert result.rss_after_all_mb / result.rss_after_100_mb - 1 <= 0.10, result.lines()
