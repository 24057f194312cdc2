"""The per-request reads select exactly the rows their rule names, for rows of every status.

Each rule is stated once, as a queryset; where Python also decides on the same
rows (``SynthesisJob.is_finished``, ``ApiKey.is_usable``), the rows the query
counts are checked against the ones Python picks.
"""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.api.direct_jobs import job_row

ENGINE = "rulestest"  # no real worker's jobs or heartbeats of this engine


def _job(org: Any, status: str, at: dt.datetime, chars: int = 10, engine: str = ENGINE, **fields: Any) -> Any:
    return job_row(org, status, at, chars=chars, engine=engine, **fields)


def test_a_queued_jobs_position_and_wait_count_the_jobs_ahead_of_it_as_python_sees_them(
    make_tenant: Any,
) -> None:
    from webapp.speech.models import SynthesisJob
    from webapp.speech.services import eta

    Status = SynthesisJob.Status
    org = make_tenant().org
    t0 = timezone.now() - dt.timedelta(minutes=10)
    mine = _job(org, Status.QUEUED, t0, chars=7)
    others = []
    for i, status in enumerate(Status):  # of every status, created before and after it
        for seconds in (-60 + i, 60 + i):
            others.append(
                _job(org, status, t0 + dt.timedelta(seconds=seconds), chars=10 * (i + 1), progress=0.25)
            )
    _job(org, Status.QUEUED, t0 - dt.timedelta(hours=1), engine="otherengine")  # another engine's
    _job(org, Status.RUNNING, t0 - dt.timedelta(hours=1), engine="otherengine")
    # Ahead of it: not finished, and running (whenever created) or queued before it.
    ahead = [
        j
        for j in others
        if not j.is_finished and (j.status == Status.RUNNING or j.created_at < mine.created_at)
    ]
    assert {j.status for j in ahead} == set(SynthesisJob.ACTIVE)
    position = sum(1 for j in ahead if j.status == Status.QUEUED)
    work = sum(
        j.text_chars * (1.0 - j.progress) if j.status == Status.RUNNING else j.text_chars for j in ahead
    )
    spc = 0.01
    assert eta.estimate(mine, eta.EtaBasis(spc, 1, {})) == (
        pytest.approx(round(spc * (work + 7), 1)),
        position,
    )
    # With as many children as jobs ahead, one is free for it: no wait.
    assert eta.estimate(mine, eta.EtaBasis(spc, len(ahead) + 1, {})) == (
        pytest.approx(round(spc * 7, 1)),
        position,
    )
    for job in others:  # a finished job has neither; a running one no position
        eta_seconds, at = eta.estimate(job, eta.EtaBasis(spc, 1, {}))
        if job.is_finished:
            assert (eta_seconds, at) == (None, None), job.status
        elif job.status == Status.RUNNING:
            assert eta_seconds == pytest.approx(round(spc * job.text_chars * 0.75, 1)) and at is None


def test_a_submit_may_name_only_ready_voices_of_its_own_or_built_in(make_tenant: Any) -> None:
    from webapp.speech.models import Voice
    from webapp.speech.services.queries import visible_voice

    mine, theirs = make_tenant().org, make_tenant().org
    for status in Voice.Status:
        for owner in (mine, theirs, None):
            voice_id = f"rules-{status}-{owner.slug if owner else 'builtin'}"
            Voice.objects.create(
                voice_id=voice_id,
                organization=owner,
                name=voice_id,
                engine=ENGINE,
                language="en",
                sample_rate=16000,
                status=status,
            )
            found = visible_voice(mine, voice_id)
            expected = status == Voice.Status.READY and owner in (mine, None)
            assert (found is not None) == expected, voice_id
            assert found is None or (found.voice_id == voice_id and found.status == Voice.Status.READY)


def test_a_key_comes_with_its_holders_role_at_each_lookup(make_tenant: Any, django_user_model: Any) -> None:
    from webapp.tenants import roles
    from webapp.tenants.models import Membership
    from webapp.tenants.services import OPERATOR, create_api_key, find_api_key, key_role

    t, elsewhere = make_tenant(), make_tenant()
    holder = django_user_model.objects.create_user("rules-holder", password="pw-rules-holder-1")
    Membership.objects.create(user=holder, organization=t.org, role="member")
    key, raw = create_api_key(t.org, "holder's", created_by=OPERATOR, user=holder, scopes=["speech:read"])
    found = find_api_key(raw)
    assert found is not None and found.pk == key.pk and key_role(found) == "member"
    Membership.objects.filter(user=holder).update(role="admin")
    found = find_api_key(raw)
    assert found is not None and key_role(found) == "admin"  # read at the lookup, not kept
    Membership.objects.filter(user=holder).delete()
    Membership.objects.create(user=holder, organization=elsewhere.org, role="owner")
    assert find_api_key(raw) is None  # a member of another tenant only: the key acts for no one
    _, tenant_raw = create_api_key(t.org, "tenant's", created_by=OPERATOR)
    found = find_api_key(tenant_raw)
    assert found is not None and found.holder_role is None  # type: ignore[attr-defined]
    assert key_role(found) == roles.TENANT_KEY_ROLE
    assert find_api_key(tenant_raw[:-1] + ("a" if tenant_raw[-1] != "a" else "b")) is None  # wrong secret
    t.org.is_active = False
    t.org.save(update_fields=["is_active"])
    assert find_api_key(tenant_raw) is None


def _percentile(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear between the two values around the position."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def test_the_operations_figures_count_every_status_and_measure_only_finished_successes(
    make_tenant: Any,
) -> None:
    from webapp.speech import operations
    from webapp.speech.models import SynthesisJob

    Status = SynthesisJob.Status
    org = make_tenant().org
    # In the future: no other job of the database is created or finished since then.
    since = timezone.now() + dt.timedelta(days=1000)
    later = since + dt.timedelta(minutes=1)
    created: dict[str, int] = {}
    waits, rtfs = [], []
    for i, status in enumerate(Status):
        for n in range(i + 1):
            queue_ms, rtf = 100 * (i + 1) + 7 * n, 0.05 * (i + 1) + 0.01 * n
            _job(org, status, later, finished_at=later, metrics={"queue_ms": queue_ms, "rtf": rtf})
            created[status] = created.get(status, 0) + 1
            if status == Status.SUCCEEDED:
                waits.append(queue_ms / 1000)
                rtfs.append(rtf)
    before = since - dt.timedelta(minutes=1)
    _job(org, Status.SUCCEEDED, before, finished_at=before, metrics={"queue_ms": 9e6, "rtf": 9.0})  # neither
    _job(
        org, Status.SUCCEEDED, before, finished_at=later, metrics={"queue_ms": 5, "rtf": 0.2}
    )  # measured only
    waits.append(0.005)
    rtfs.append(0.2)
    for metrics in (
        {"queue_ms": 1},
        {"rtf": 1.0},
        {"queue_ms": None, "rtf": 1.0},
        {},
    ):  # created, not measured
        _job(org, Status.SUCCEEDED, later, finished_at=later, metrics=metrics)
        created[Status.SUCCEEDED] += 1
    figures = operations.job_figures(since)
    assert figures["by_status"] == {s: created.get(s, 0) for s in Status.values}
    assert figures["measured"] == len(waits) == len(rtfs)
    assert figures["queue_wait_p50"] == pytest.approx(round(statistics.median(waits), 2))
    assert figures["queue_wait_p95"] == pytest.approx(round(_percentile(waits, 0.95), 2))
    assert figures["rtf_p50"] == pytest.approx(round(statistics.median(rtfs), 4))
    assert figures["rtf_p95"] == pytest.approx(round(_percentile(rtfs, 0.95), 4))
    empty = operations.job_figures(since + dt.timedelta(days=1))
    assert empty["measured"] == 0 and empty["queue_wait_p50"] is None and empty["rtf_p95"] is None
    assert set(empty["by_status"].values()) == {0}
