"""prometheus-client's multiprocess mode for gunicorn: no Django here (deploy/gunicorn.conf.py imports it).

Each worker process writes its counters to files in ``PROMETHEUS_MULTIPROC_DIR``;
a scrape in any process adds up all of them. The folder must be set before
prometheus-client is imported (so in gunicorn's master, before forking) and
emptied when the server starts, or counts of a previous run would be added in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def default_dir() -> Path:
    var_dir = os.environ.get("TTS_VAR_DIR") or str(Path(__file__).resolve().parents[2] / "var")
    return Path(var_dir) / "run" / "prometheus"


def prepare() -> Path:
    """Set (unless set) and empty the folder; call once in the master before workers start."""
    folder = Path(os.environ.setdefault(ENV, str(default_dir())))
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, mode=0o700)
    return folder


def mark_dead(pid: int) -> None:
    """A worker process left: its live gauges go (counters and histograms are kept)."""
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
