"""Every housekeeping job: importing a family's module registers its jobs in ``JOBS``.

Import ``JOBS`` and ``run_job`` from here, not from ``jobs`` (the framework the
families build on), so the registry is always complete.
"""

from __future__ import annotations

from webapp.housekeeping import disk, operations, records, sentence_cache, synthesis, voices
from webapp.housekeeping.jobs import JOBS, RunResult, run_job

FAMILIES = (disk, operations, records, sentence_cache, synthesis, voices)

__all__ = ["FAMILIES", "JOBS", "RunResult", "run_job"]
