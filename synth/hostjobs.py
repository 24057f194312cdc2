"""How many jobs run on this host right now, counted without a coordinator.

Each running job holds an exclusive ``flock`` on a file of its own in one
folder; the kernel drops the lock when the process dies, so a killed
worker's job stops counting at once (its file is removed by the next
reader). A job's file is locked under a hidden name first and then renamed
into place, so a reader never takes a fresh job's file for a dead one.

The Piper engine asks it before each sentence: a job alone on the host may
use every core for inference, a job with company keeps to its share. An
interactive job (a client waiting for its first audio) also leaves a mark
whose age says how lately one ran here: the worker keeps a batch job to its
share while that is recent, so the next interactive job finds a core free.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class HostJobs:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._own: set[str] = set()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count this process's job as running on the host while the block runs.

        A folder that cannot be written (read-only, full disk) costs only the
        count: the job runs anyway, and others may then take it for idle.
        """
        name = f"{os.getpid()}.{uuid.uuid4().hex}"
        hidden = self.folder / f".{name}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(hidden, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(hidden, self.folder / name)
            self._own.add(name)
            yield
        finally:
            self._own.discard(name)
            for path in (self.folder / name, hidden):
                path.unlink(missing_ok=True)
            os.close(fd)

    INTERACTIVE_MARK = ".interactive"  # hidden: never counted as a job

    def note_interactive(self) -> None:
        """An interactive job runs on this host now (the mark's time is its latest)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / self.INTERACTIVE_MARK).touch()
        except OSError:
            pass  # the mark only tunes threads: a folder that cannot be written costs that

    def interactive_within(self, seconds: float) -> bool:
        """Whether an interactive job ran on this host in the last ``seconds``."""
        try:
            noted = (self.folder / self.INTERACTIVE_MARK).stat().st_mtime
        except OSError:
            return False
        return time.time() - noted < seconds

    def others(self) -> int:
        """Jobs running on the host besides this process's own (files of dead ones are removed)."""
        count = 0
        try:
            entries = list(os.scandir(self.folder))
        except OSError:  # no folder yet (no job ever ran), or none can be made
            return 0
        for entry in entries:
            if entry.name.startswith(".") or entry.name in self._own:
                continue
            if self._held(Path(entry.path)):
                count += 1
        return count

    @staticmethod
    def _held(path: Path) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False  # ended meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            path.unlink(missing_ok=True)  # nobody holds it: its process is gone
            return False
        finally:
            os.close(fd)
