"""One beat sends the schedule: a second real `celery beat` waits for the lease and takes over when
the first dies; and `snapshot_operations` writes one row a minute however often it runs."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from deploy.supervisor import Service
from tests.integration.housekeeping.conftest import Clock
from tests.stack import CFG, TestStack, django_env
from webapp.housekeeping.catalog import run_job

LEASE = 3  # seconds: the TTL the two beats use
SENDING = "Sending due task housekeeping.snapshot_operations"


def _beat(stack: TestStack, name: str) -> tuple[Service, Path]:
    """A real beat of its own (its own schedule file, as on its own machine), sending every second."""
    from deploy import stack as deploy_stack

    command = deploy_stack.beat_command(CFG)
    schedule = CFG.path("run", f"{name}-schedule")
    for leftover in CFG.path("run").glob(f"{name}-schedule*"):
        leftover.unlink()
    command[command.index("--schedule") + 1] = str(schedule)
    env = django_env(
        name,
        TTS_BEAT_LEASE_SECONDS=str(LEASE),
        TTS_HOUSEKEEPING_EVERY_SNAPSHOT_OPERATIONS="1",
    )
    log = CFG.log_dir / f"{name}.log"
    log.unlink(missing_ok=True)
    return stack.start_service(Service(name, command, env=env)), log


def _wait_for(log: Path, text: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(
        f"{text!r} not in {log} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}"
    )


def _sent(log: Path) -> int:
    return log.read_text(errors="replace").count(SENDING)


@pytest.fixture
def no_lease(stack: TestStack) -> Any:
    r = stack.redis_client()
    r.delete("tts:beat:leader")
    yield r
    r.delete("tts:beat:leader", "housekeeping")  # nothing of the beats' left to run


def test_a_second_beat_waits_for_the_lease_and_takes_over_when_the_first_dies(
    stack: TestStack, no_lease: Any
) -> None:
    first, first_log = _beat(stack, "beat-a")
    second: Service | None = None
    try:
        _wait_for(first_log, SENDING, 60)
        second, second_log = _beat(stack, "beat-b")
        _wait_for(second_log, "waiting for it", 60)
        # Longer than the lease: the first renews it, the second keeps waiting and sends nothing.
        sent_before = _sent(first_log)
        time.sleep(2 * LEASE)
        assert _sent(second_log) == 0, second_log.read_text()[-2000:]
        assert _sent(first_log) > sent_before, "the first beat stopped sending"

        killed = time.monotonic()
        stack.stop_service(first, sig=signal.SIGKILL)  # no release: the lease must lapse
        took_over = _wait_for(second_log, SENDING, 30)
        # Within the TTL (plus the first tick and a loaded machine's slack), not before.
        assert took_over - killed < LEASE + 10
        assert "holds the lease" in second_log.read_text()

        stack.stop_service(second)  # SIGTERM: a clean stop hands the lease on at once
        assert no_lease.get("tts:beat:leader") is None
    finally:
        stack.stop_service(first)
        if second is not None:
            stack.stop_service(second)


@pytest.mark.django_db
def test_snapshot_operations_writes_one_row_a_minute_whatever_runs_it(
    clock: Clock, isolated: None, lock_free: None
) -> None:
    from webapp.housekeeping.models import OperationsSnapshot

    OperationsSnapshot.objects.all().delete()  # other tests' rows (rolled back with the test)
    clock.now = clock.now.replace(second=5)
    run_job("snapshot_operations")  # beat's run
    clock.advance(50)
    run_job("snapshot_operations")  # a second beat's, or one by hand, in the same minute
    assert OperationsSnapshot.objects.count() == 1
    clock.advance(10)  # the next minute
    run_job("snapshot_operations")
    minutes = list(OperationsSnapshot.objects.order_by("at").values_list("at", flat=True))
    assert [m.second for m in minutes] == [0, 0] and (minutes[1] - minutes[0]).total_seconds() == 60


def test_a_beat_whose_lease_vanished_stops_at_its_next_renewal(stack: TestStack, no_lease: Any) -> None:
    import threading

    from webapp.housekeeping.locks import BeatLease

    lease = BeatLease(1, client=stack.redis_client())
    lease.wait_and_take()
    lost = threading.Event()
    lease.keep(on_lost=lost.set)
    try:
        time.sleep(1.5)  # renewed past its TTL: still held
        assert not lost.is_set() and no_lease.get("tts:beat:leader") == lease.token
        no_lease.delete("tts:beat:leader")  # a Redis restarted without its data
        assert lost.wait(2), "the holder went on as if it still held the lease"
    finally:
        lease.release()
