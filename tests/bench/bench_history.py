"""Queries over a long history: tests/integration/housekeeping/test_history_plans.py with 10M rows.

The test suite runs it with 1M rows of history against 1k; this runs the same tests with
``TTS_HISTORY_ROWS`` rows (10M; ``--quick``: 1M) and prints, per statement, the buffers it read
for each: the reaper's lapsed waiters, text retention, a capped key's submit, GET /api/v1/usage and
the usage explorer over a year. A few minutes and some GB of the test stack's disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/integration/housekeeping/test_history_plans.py"


def run(quick: bool) -> list[str]:
    rows = 1_000_000 if quick else 10_000_000
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "history.jsonl"
        env = {**os.environ, "TTS_HISTORY_ROWS": str(rows), "TTS_HISTORY_REPORT": str(report)}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", MODULE],
            cwd=ROOT,
            env=env,
            check=False,
        )
        figures = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    lines = [f"history of {rows:,} rows: the tests {'passed' if done.returncode == 0 else 'FAILED'}"]
    for f in figures:
        lines.append(f"  {f['test']}: {f['small']} buffers at 1k, {f['large']} at {rows:,}: {f['sql'][:90]}")
    for line in lines:
        print(line, flush=True)
    return lines
