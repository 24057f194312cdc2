"""The ETA formula (docs/api.md, "Queue position and ETA") on constructed rows.

Jobs use a made-up engine so no real worker's history or heartbeat can leak
into the figures; heartbeats go through the real Redis.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.api.conftest import Tenant
from tests.integration.api.direct_jobs import job_row

ENGINE = "etatest"


def _job(org: Any, status: str, chars: int, at: dt.datetime, **fields: Any) -> Any:
    return job_row(org, status, at, chars=chars, engine=ENGINE, **fields)


def _done(org: Any, chars: int, synth_ms: Any, device: str, finished: dt.datetime) -> Any:
    metrics = {"device": device} if synth_ms is None else {"device": device, "synth_ms": synth_ms}
    return _job(org, "succeeded", chars, finished, finished_at=finished, metrics=metrics)


def test_rolling_mean_is_per_device_and_length_weighted(
    make_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.speech.services import eta

    org = make_tenant().org
    t0 = timezone.now() - dt.timedelta(hours=1)
    assert eta.rolling_seconds_per_char(ENGINE) == ({}, None)  # no history
    _done(org, 1000, 99000, "cpu", t0)  # oldest: outside a sample of 2 per device
    _done(org, 100, 1000, "cpu", t0 + dt.timedelta(seconds=1))
    _done(org, 300, 1000, "cpu", t0 + dt.timedelta(seconds=2))
    _done(org, 200, 200, "cuda:0", t0 + dt.timedelta(seconds=3))
    _done(org, 500, None, "cuda:0", t0 + dt.timedelta(seconds=4))  # no synth_ms: ignored
    monkeypatch.setattr(eta, "ETA_SAMPLE_JOBS", 2)
    by_device, overall = eta.rolling_seconds_per_char(ENGINE)
    assert by_device == pytest.approx({"cpu": 2000 / 1000 / 400, "cuda:0": 200 / 1000 / 200})
    # All devices: the newest 2 usable rows (cuda 200 chars, cpu 300 chars).
    assert overall == pytest.approx(1200 / 1000 / 500)

    def beat(device: str, state: str = "ready", engines: tuple[str, ...] = (ENGINE,)) -> dict[str, Any]:
        return {"device": device, "state": state, "engines": list(engines)}

    workers = [
        beat("cpu"),
        beat("cuda:0"),
        beat("cuda:0", state="recycling"),
        beat("cpu", state="loading"),  # not serving yet
        beat("cpu", engines=("piper",)),  # another engine
    ]
    basis = eta.eta_basis(ENGINE, workers)
    assert basis.devices == {"cpu": 1, "cuda:0": 2} and basis.children == 3
    # Pool speed: 1/0.005 + 2/0.001 = 2200 chars/s over 3 children.
    assert basis.seconds_per_char == pytest.approx(3 / 2200)
    # A device without history counts at the engine's all-device mean.
    assert eta.eta_basis(ENGINE, [beat("cuda:1")]).seconds_per_char == pytest.approx(overall)
    # Nobody serving: one child at the all-device mean.
    alone = eta.eta_basis(ENGINE, [])
    assert (alone.seconds_per_char, alone.children) == (pytest.approx(overall), 1)


def test_eta_shares_the_jobs_ahead_among_children(make_tenant: Any) -> None:
    from webapp.speech.services import eta

    org = make_tenant().org
    t0 = timezone.now() - dt.timedelta(minutes=5)
    _job(org, "running", 400, t0, progress=0.5)  # 200 chars left
    _job(org, "queued", 100, t0 + dt.timedelta(seconds=1))
    _job(org, "queued", 200, t0 + dt.timedelta(seconds=2))
    mine = _job(org, "queued", 50, t0 + dt.timedelta(seconds=3))
    _job(org, "queued", 999, t0 + dt.timedelta(seconds=4))  # behind: not counted
    assert eta.estimate(mine, 0.01)[1] == 2  # its queue position

    def eta_with(children: int) -> float | None:
        return eta.estimate_eta(mine, eta.EtaBasis(0.01, children, {}))

    # 3 jobs ahead, 500 chars of work: wait 0.01 * 500 / N, then 0.01 * 50 of its own.
    assert eta_with(1) == pytest.approx(5.0 + 0.5)
    assert eta_with(2) == pytest.approx(2.5 + 0.5)
    assert eta_with(3) == pytest.approx(500 * 0.01 / 3 + 0.5, abs=0.05)
    assert eta_with(4) == pytest.approx(0.5)  # a child is free for it
    running = _job(org, "running", 300, t0, progress=0.25)
    assert eta.estimate_eta(running, eta.EtaBasis(0.01, 2, {})) == pytest.approx(2.2, abs=0.05)
    assert eta.estimate_eta(_done(org, 10, 5, "cpu", t0), 0.01) is None


def test_api_eta_uses_live_heartbeats(make_tenant: Any, stack: Any) -> None:
    from webapp.speech import heartbeat
    from webapp.speech.services import eta

    t: Tenant = make_tenant()
    t0 = timezone.now() - dt.timedelta(minutes=5)
    _done(t.org, 1000, 4000, "cpu", t0)  # cpu: 0.004 s/char
    _done(t.org, 1000, 1000, "cuda:0", t0 + dt.timedelta(seconds=1))  # cuda: 0.001 s/char
    _job(t.org, "queued", 600, t0 + dt.timedelta(seconds=2))
    mine = _job(t.org, "queued", 500, t0 + dt.timedelta(seconds=3))

    def get_eta() -> float:
        eta.forget_bases()  # what a process sees after its saved basis has aged (a second)
        body = t.client.get(f"/api/v1/speech/{mine.id}").json()
        assert body["queue_position"] == 1
        return float(body["eta_seconds"])

    # No child serves the engine: one child at the all-device mean (2000 chars in 5 s).
    assert get_eta() == pytest.approx(0.0025 * (600 + 500), abs=0.05)
    ids = ["eta-test:1", "eta-test:2"]
    try:
        for worker_id, device in zip(ids, ("cpu", "cuda:0"), strict=True):
            beat = {"worker_id": worker_id, "state": "ready", "device": device, "engines": [ENGINE]}
            heartbeat.publish(worker_id, beat, ttl=30)
        # Two children: 1/0.004 + 1/0.001 = 1250 chars/s, s = 2/1250 = 0.0016 s/char;
        # one job ahead < 2 children, so no wait: eta = 0.0016 * 500.
        assert get_eta() == pytest.approx(0.8, abs=0.05)
        _job(t.org, "running", 1000, t0, progress=0.5)  # now 2 ahead: wait 0.0016 * 1100 / 2
        assert get_eta() == pytest.approx(0.88 + 0.8, abs=0.05)
    finally:
        for worker_id in ids:
            heartbeat.remove(worker_id)


def test_a_process_reads_an_engines_basis_at_most_once_a_second(
    make_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.speech.services import eta

    org = make_tenant().org
    t0 = timezone.now() - dt.timedelta(minutes=5)
    _done(org, 1000, 4000, "cpu", t0)
    eta.forget_bases()
    clock = [1000.0]
    monkeypatch.setattr(eta.time, "monotonic", lambda: clock[0])
    first = eta.eta_basis(ENGINE)
    assert first.seconds_per_char == pytest.approx(0.004)
    _done(org, 1000, 1000, "cpu", t0 + dt.timedelta(seconds=1))  # the mean becomes 0.0025
    clock[0] += eta.BASIS_MAX_AGE_SECONDS - 0.01
    with CaptureQueriesContext(connection) as queries:
        assert eta.eta_basis(ENGINE) is first  # within the second: no query
    assert len(queries) == 0
    clock[0] += 0.02
    assert eta.eta_basis(ENGINE).seconds_per_char == pytest.approx(0.0025)  # aged: read again
    queued = _job(org, "queued", 100, t0 + dt.timedelta(seconds=2))
    with CaptureQueriesContext(connection) as queries:
        assert eta.estimate(queued) == (pytest.approx(0.2), 0)  # position and ETA in one query
    assert len(queries) == 1


def test_a_pool_at_zero_adds_its_cold_start_to_queued_jobs(make_tenant: Any, settings: Any) -> None:
    from webapp.speech.services import eta

    org = make_tenant().org
    t0 = timezone.now() - dt.timedelta(minutes=5)
    _done(org, 1000, 4000, "cpu", t0)  # 0.004 s/char
    mine = _job(org, "queued", 500, t0 + dt.timedelta(seconds=1))
    settings.TTS_POOL_COLD_START_SECONDS = 90.0
    assert eta.eta_basis(ENGINE, []).cold_start == 0.0  # a queue that does not scale to zero
    settings.TTS_SCALE_TO_ZERO_QUEUES = [f"synth.{ENGINE}"]
    at_zero = eta.eta_basis(ENGINE, [])
    assert at_zero.cold_start == 90.0
    assert eta.estimate(mine, at_zero) == (pytest.approx(90.0 + 0.004 * 500), 0)
    # A live child: the pool is up, no cold start.
    up = eta.eta_basis(ENGINE, [{"device": "cpu", "state": "ready", "engines": [ENGINE]}])
    assert up.cold_start == 0.0 and eta.estimate(mine, up) == (pytest.approx(0.004 * 500), 0)
    running = _job(org, "running", 100, t0, progress=0.5)  # a running job has its worker
    assert eta.estimate_eta(running, at_zero) == pytest.approx(0.2)
