"""Jobs running on the host (synth.hostjobs) and the Piper session a sentence gets from it."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any, cast

from synth import DEFAULT_VOICE
from synth.engines.base import VoiceParams
from synth.engines.piper import PiperEngine
from synth.hostjobs import HostJobs


def _hold(folder: str, ready: Any, stop: Any) -> None:
    with HostJobs(folder).running():
        ready.set()
        stop.wait(30)


def test_it_counts_other_processes_jobs_and_forgets_a_killed_one(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    here = HostJobs(tmp_path)
    assert here.others() == 0
    holders = []
    for _ in range(2):
        ready, stop = ctx.Event(), ctx.Event()
        process = ctx.Process(target=_hold, args=(str(tmp_path), ready, stop))
        process.start()
        assert ready.wait(30)
        holders.append((process, stop))
    try:
        assert here.others() == 2
        with here.running():
            assert here.others() == 2  # its own job is not counted
        holders[0][1].set()
        holders[0][0].join(30)
        assert here.others() == 1  # ended normally: its file is gone
        os.kill(holders[1][0].pid, signal.SIGKILL)  # type: ignore[arg-type]
        holders[1][0].join(30)
        assert here.others() == 0  # killed: the kernel dropped its lock
        assert [p.name for p in tmp_path.iterdir()] == []  # and the reader removed its file
    finally:
        for process, _stop in holders:
            if process.is_alive():  # (an event a killed waiter slept on must not be set)
                process.kill()
                process.join(5)


def test_an_unwritable_folder_only_loses_the_count(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    jobs = HostJobs(blocked / "jobs")
    with jobs.running():
        assert jobs.others() == 0


def test_piper_uses_its_solo_session_only_while_no_other_job_runs() -> None:
    busy = {"now": False}
    engine = PiperEngine(threads=1, solo_threads=2, busy=lambda: busy["now"])
    engine.load("cpu", [DEFAULT_VOICE])
    sessions = {cast(int, key[1]): voice.session for key, voice in engine._loaded.items()}
    assert sorted(sessions) == [1, 2]  # both loaded up front (the child's memory baseline)
    assert [s.get_session_options().intra_op_num_threads for s in (sessions[1], sessions[2])] == [1, 2]

    used: list[int] = []
    real = engine._chunk_audio

    def spy(voice: Any, text: str, params: VoiceParams) -> Any:
        used.append(voice.session.get_session_options().intra_op_num_threads)
        busy["now"] = True  # another job starts during the first sentence
        return real(voice, text, params)

    engine._chunk_audio = spy  # type: ignore[method-assign]
    chunks = ["The first sentence.", "The second sentence."]
    audio = list(engine.synthesize(chunks, VoiceParams(voice=DEFAULT_VOICE)))
    assert len(audio) == 2 and all(a.size > 1000 for a in audio)
    assert used == [2, 1]


def test_piper_without_a_busy_check_keeps_one_session() -> None:
    engine = PiperEngine(threads=1, solo_threads=2)
    engine.load("cpu", [DEFAULT_VOICE])
    assert [key[1] for key in engine._loaded] == [1]


def test_an_interactive_job_leaves_a_mark_that_is_no_job_and_ages(tmp_path: Path) -> None:
    import time

    here = HostJobs(tmp_path)
    assert not here.interactive_within(30)
    here.note_interactive()
    assert here.interactive_within(30)
    assert here.others() == 0  # the mark is not a job
    long_ago = time.time() - 60
    os.utime(tmp_path / HostJobs.INTERACTIVE_MARK, (long_ago, long_ago))
    assert not here.interactive_within(30)
