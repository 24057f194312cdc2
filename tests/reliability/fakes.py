"""Injected readings for worker tests (what cannot be real on a CPU-only CI machine).

``TTS_WORKER_GPU_MEMORY_READER=tests.reliability.fakes:gpu_mb_from_file`` makes a
worker child read "its GPU memory" from the file named by ``TTS_FAKE_GPU_MB_FILE``,
so the test can raise the reading and watch the child being recycled.
"""

from __future__ import annotations

import os


def gpu_mb_from_file() -> float | None:
    path = os.environ.get("TTS_FAKE_GPU_MB_FILE", "")
    try:
        with open(path) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return None
