"""Submits and worker completes of one tenant never deadlock (one lock order: job, tenant, usage period).

The deadlock seen in tests/reliability/test_recycling.py: a worker charging a
job held the tenant's usage row and, at COMMIT, Django's deferred foreign-key
check of its usage event asked for a KEY SHARE lock on the tenant row, while a
submit held that row FOR UPDATE and waited for the usage row.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections

from tests.integration.api.conftest import Tenant
from tests.integration.api.direct_jobs import submit_espeak

DONE: dict[str, Any] = {
    "audio_path": "audio/x.wav",
    "audio_bytes": 10,
    "duration_seconds": 1.0,
    "metrics": {},
    "applied_instructions": {},
}


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected fault: no message reaches a worker; the test plays the worker itself."""
    from webapp.speech.services import dispatch

    monkeypatch.setattr(dispatch, "dispatch_job", lambda job_id, *known: False)


@pytest.fixture
def tenant(transactional_db: None, builtin_voices: list[str], no_dispatch: None) -> Tenant:
    from tests.integration.api.conftest import ApiClient
    from webapp.tenants.models import Plan
    from webapp.tenants.services import OPERATOR, create_api_key, create_organization

    plan = Plan.objects.create(
        slug=f"lock-order-{uuid.uuid4().hex[:8]}",
        name="Lock order",
        requests_per_minute=10_000,
        max_concurrent_jobs=500,
    )
    org = create_organization("Lock order tenant", plan=plan)
    key, raw = create_api_key(org, "k", created_by=OPERATOR)
    return Tenant(org=org, key=key, raw_key=raw, client=ApiClient(raw))


def _claim(job_id: Any) -> int:
    from webapp.speech import lifecycle

    job = lifecycle.claim_job(job_id, "test-worker:1")
    assert job is not None
    return int(job.claim_token)


def _session(autocommit: bool = False) -> psycopg.Connection[Any]:
    db: dict[str, Any] = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"],
        autocommit=autocommit,
    )


@pytest.fixture
def blocker() -> Iterator[psycopg.Connection[Any]]:
    """A session of our own, to hold a lock while the two under test queue behind it."""
    with _session() as conn:
        yield conn


@pytest.fixture
def observer() -> Iterator[psycopg.Connection[Any]]:
    """A session that watches the others wait (pg_stat_activity is read per transaction: autocommit)."""
    with _session(autocommit=True) as conn:
        yield conn


def _in_thread(fn: Callable[[], Any], results: dict[str, Any], name: str) -> threading.Thread:
    def run() -> None:
        try:
            connections["default"].ensure_connection()
            results[f"{name}_pid"] = connection.connection.info.backend_pid
            results[name] = fn()
        except Exception as exc:
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_until_blocked(observer: psycopg.Connection[Any], results: dict[str, Any], name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and name not in results:
        pid = results.get(f"{name}_pid")
        if pid is not None:
            row = observer.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if row and row[0] == "Lock":
                return
        time.sleep(0.01)
    raise AssertionError(f"{name} never queued for its lock: {results}")


def test_a_submit_and_a_charge_of_one_tenant_do_not_deadlock(
    tenant: Tenant, blocker: psycopg.Connection[Any], observer: psycopg.Connection[Any]
) -> None:
    """Charge first in the queue for the usage row, submit right behind it: both must finish."""
    from webapp.speech import lifecycle
    from webapp.speech.models import UsagePeriod

    running = submit_espeak(tenant.org)
    token = _claim(running.id)
    results: dict[str, Any] = {}
    # The blocker holds the usage row, so the charge and then the submit line up behind it.
    blocker.execute("SELECT 1 FROM speech_usageperiod WHERE organization_id = %s FOR UPDATE", [tenant.org.pk])
    charge = _in_thread(lambda: lifecycle.complete_job(running.id, token, **DONE), results, "charge")
    _wait_until_blocked(observer, results, "charge")
    submit = _in_thread(lambda: submit_espeak(tenant.org), results, "submit")
    _wait_until_blocked(observer, results, "submit")
    blocker.rollback()
    charge.join(30)
    submit.join(30)
    assert results["charge"] is True, results["charge"]
    assert not isinstance(results["submit"], Exception), results["submit"]
    row = UsagePeriod.objects.get(organization=tenant.org)
    assert (row.characters_used, row.characters_reserved) == (10, 10)


def test_parallel_submits_and_completes_of_one_tenant_all_finish(tenant: Tenant) -> None:
    """Three submitters and three 'workers' in threads, as tests/reliability/test_recycling.py did."""
    from webapp.speech import lifecycle
    from webapp.speech.models import SynthesisJob, UsagePeriod

    per_thread = 12
    errors: list[BaseException] = []
    submitted: list[Any] = []
    lock = threading.Lock()

    def submitter() -> None:
        try:
            for _ in range(per_thread):
                job = submit_espeak(tenant.org)
                with lock:
                    submitted.append(job.id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def worker() -> None:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                job = lifecycle.claim_next("espeak", f"w:{threading.get_ident()}")
                if job is not None:
                    lifecycle.complete_job(job.id, job.claim_token, **DONE)
                elif len(submitted) == 3 * per_thread:
                    return
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=f) for f in (submitter, worker) * 3]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    assert errors == []
    assert SynthesisJob.objects.filter(organization=tenant.org, status="succeeded").count() == 3 * per_thread
    row = UsagePeriod.objects.get(organization=tenant.org)
    assert (row.characters_used, row.characters_reserved) == (3 * per_thread * 10, 0)


def test_a_tenant_deletion_and_a_completion_of_its_job_do_not_deadlock(
    tenant: Tenant, blocker: psycopg.Connection[Any], observer: psycopg.Connection[Any]
) -> None:
    """The deletion first, holding what it locked so far; a completion of the tenant's job right behind.

    Both wait on the blocker's usage row lock, then run on. With the tenant row
    locked before the jobs (the old order) the deletion, let go, waits for the
    job the completion holds while the completion waits for the tenant row:
    PostgreSQL's deadlock_detected ends one of them.
    """
    from webapp.speech import lifecycle, operator
    from webapp.speech.models import SynthesisJob, UsageEvent
    from webapp.tenants.models import Organization

    running = submit_espeak(tenant.org)
    token = _claim(running.id)
    results: dict[str, Any] = {}
    blocker.execute("SELECT 1 FROM speech_usageperiod WHERE organization_id = %s FOR UPDATE", [tenant.org.pk])
    delete = _in_thread(lambda: operator.delete_tenant(tenant.org), results, "delete")
    _wait_until_blocked(observer, results, "delete")
    charge = _in_thread(lambda: lifecycle.complete_job(running.id, token, **DONE), results, "charge")
    _wait_until_blocked(observer, results, "charge")
    blocker.rollback()
    delete.join(30)
    charge.join(30)
    assert not isinstance(results["delete"], Exception), results["delete"]
    assert results["delete"]["synthesisjob"] == 1
    # The job went with its tenant before the completion reached it: nothing published, nothing charged.
    assert results["charge"] is False, results["charge"]
    assert not Organization.objects.filter(pk=tenant.org.pk).exists()
    assert not SynthesisJob.objects.filter(pk=running.id).exists()
    assert not UsageEvent.objects.filter(job_key=running.id).exists()


def test_a_tenant_deletion_starts_over_when_a_job_arrives_while_it_takes_its_locks(
    tenant: Tenant,
    blocker: psycopg.Connection[Any],
    observer: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that appears between the deletion's job locks and its tenant lock goes too, in a second pass."""
    from webapp.speech import operator
    from webapp.speech.models import SynthesisJob

    passes: list[int] = []
    lock_in_order = operator._lock_in_order

    def counted(org_id: Any) -> Any:
        passes.append(1)
        return lock_in_order(org_id)

    monkeypatch.setattr(operator, "_lock_in_order", counted)
    submit_espeak(tenant.org)
    results: dict[str, Any] = {}
    # Holding the tenant row as a submit does: the deletion locks the one job, then waits here.
    blocker.execute("SELECT 1 FROM tenants_organization WHERE id = %s FOR NO KEY UPDATE", [tenant.org.pk])
    delete = _in_thread(lambda: operator.delete_tenant(tenant.org), results, "delete")
    _wait_until_blocked(observer, results, "delete")
    # The job "that submit" inserts (committed, unlocked), before it lets the tenant row go.
    late = SynthesisJob.objects.create(
        organization=tenant.org,
        voice_name="espeak-en-us",
        engine="espeak",
        text="late",
        text_chars=4,
        format="wav",
    )
    blocker.rollback()
    delete.join(30)
    assert not isinstance(results["delete"], Exception), results["delete"]
    assert results["delete"]["synthesisjob"] == 2
    assert len(passes) == 2
    assert not SynthesisJob.objects.filter(pk=late.pk).exists()
