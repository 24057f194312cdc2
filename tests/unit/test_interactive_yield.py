"""A batch job keeps to its share of the cores while interactive work ran on the host lately
(webapp/speech/runtime/worker.py, ``yields_to_interactive``): what the Piper engine's ``busy`` asks
before each sentence, besides the other jobs running on the host."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from synth.hostjobs import HostJobs
from webapp.speech.runtime.worker import WorkerState, yields_to_interactive


def state(lane: str | None, folder: Path) -> WorkerState:
    return cast(WorkerState, SimpleNamespace(current_lane=lane, host_jobs=HostJobs(folder)))


@pytest.mark.parametrize(
    ("lane", "interactive_lately", "reserved", "yields"),
    [
        ("batch", True, 1, True),  # an agent spoke here lately: the batch job leaves a core free
        ("batch", False, 1, False),  # a backlog alone takes every core
        ("interactive", True, 1, False),  # interactive work never yields
        ("batch", True, 0, False),  # the lanes reserve nothing: no yielding either
        (None, True, 1, False),  # no job running
    ],
)
def test_a_batch_job_yields_only_while_interactive_work_ran_lately(
    tmp_path: Path, settings: Any, lane: str | None, interactive_lately: bool, reserved: int, yields: bool
) -> None:
    settings.TTS_WORKER_INTERACTIVE_RESERVED = reserved
    settings.TTS_WORKER_INTERACTIVE_QUIET_SECONDS = 30.0
    if interactive_lately:
        HostJobs(tmp_path).note_interactive()  # another child's interactive job, on this host
    assert yields_to_interactive(state(lane, tmp_path)) is yields
