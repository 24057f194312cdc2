"""A worker's liveness and readiness from local files, for exec probes (Kubernetes, a supervisor).

Each synthesis worker child rewrites one file, ``worker-<node>-<slot>.alive`` in
``TTS_WORKER_PROBE_DIR`` (default ``$TTS_VAR_DIR/run``), from its heartbeat thread at
every beat, before that beat's Redis writes. The file says the child's state
(``ready`` once its model is loaded and warmed up) and its mtime says when the
thread last came round. ``slot`` is the child's index in the Celery pool, which
its replacement takes over, so a recycled child's file is overwritten, not left behind.

    python -m webapp.speech.runtime.probe live --max-age 60   # every child's file is fresh
    python -m webapp.speech.runtime.probe ready --max-age 60  # a fresh file says ready

Exit status 0 or 1, with one line saying why. Neither Redis nor PostgreSQL is
asked, so a Redis restart fails no worker probe; nothing heavy is imported (no
Django settings, no torch): ``webapp``'s Celery app and the standard library.

What a stale file means: the heartbeat thread (``worker.WorkerState.beat_forever``) stopped
coming round, so a child that is frozen as a whole (the GIL held in native code, a deadlock,
SIGSTOP, swapping to death) fails ``live``. That thread never asks PostgreSQL: the watchdog
reads from a thread of its own (``watch_forever``), so a database stall restarts no busy
worker; a task stuck in native code that lets the threads run is the watchdog's to end (it
ends the child once the job's row ended).
Each beat's Redis calls give up within their socket timeouts (2 s to connect,
3 s to answer), so a Redis outage delays a touch by seconds, not past ``--max-age``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from webapp.provisioning import VarLayout

SUFFIX = ".alive"
READY = "ready"
DEFAULT_MAX_AGE = 60.0


def file_name(node: str, slot: int) -> str:
    """The file of pool slot ``slot`` of Celery worker ``node`` (its ``-n`` name)."""
    safe = "".join(c if c.isalnum() or c in "@.-_" else "_" for c in node)
    return f"worker-{safe}-{slot}{SUFFIX}"


def touch(path: Path, state: str) -> None:
    """Say ``state`` and now in ``path``: written beside it, then renamed over it (readers never
    see half a file); one small write per beat."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{state} {os.getpid()}\n")
    os.replace(tmp, path)


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def files(folder: Path, node: str | None = None) -> list[Path]:
    """The children's files in ``folder``; only worker ``node``'s when given."""
    prefix = "worker-" if node is None else file_name(node, 0).rsplit("-", 1)[0] + "-"
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    if node is None:
        return [folder / n for n in names if n.startswith(prefix) and n.endswith(SUFFIX)]
    # The slot must follow the prefix: node "a@h" is not node "a@h-b".
    return [
        folder / n
        for n in names
        if n.startswith(prefix) and n.endswith(SUFFIX) and n[len(prefix) : -len(SUFFIX)].isdigit()
    ]


def _read(path: Path, now: float) -> tuple[float, str] | None:
    """(age in seconds, state) of a child's file; None when it went away meanwhile."""
    try:
        age = now - path.stat().st_mtime
        state = path.read_text().split(" ", 1)[0].strip()
    except FileNotFoundError:
        return None
    return age, state


def check(what: str, folder: Path, max_age: float, node: str | None = None) -> tuple[bool, str]:
    """(passed, why) for ``live`` (no child's file older than ``max_age``) or ``ready`` (a fresh
    file of a child whose model is loaded)."""
    now = time.time()
    seen = {p.name: r for p in files(folder, node) if (r := _read(p, now)) is not None}
    if what == "live":
        stale = sorted(name for name, (age, _) in seen.items() if age > max_age)
        if stale:
            return False, f"not live: {', '.join(stale)} older than {max_age:g} s (a frozen child)"
        # No file: no child has started yet (the parent is booting) or every one left; either
        # way no child is frozen. A wrong folder shows as a worker that never gets ready.
        return True, f"live: {len(seen)} child(ren) within {max_age:g} s"
    fresh_ready = [name for name, (age, state) in seen.items() if age <= max_age and state == READY]
    if fresh_ready:
        return True, f"ready: {len(fresh_ready)} of {len(seen)} child(ren) have their model loaded"
    states = ", ".join(f"{name}: {state}" for name, (_, state) in sorted(seen.items())) or "no child file"
    return False, f"not ready ({states}) in {folder}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.speech.runtime.probe", description=__doc__)
    parser.add_argument("what", choices=("live", "ready"))
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE, help="seconds (default 60)")
    parser.add_argument("--dir", type=Path, default=None, help="default: TTS_WORKER_PROBE_DIR")
    parser.add_argument("--node", default=None, help="only this Celery worker's children (its -n name)")
    args = parser.parse_args(argv)
    folder = args.dir if args.dir is not None else VarLayout.from_env().probe_dir
    passed, why = check(args.what, folder, args.max_age, args.node)
    print(why)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
