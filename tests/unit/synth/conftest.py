"""Fixtures for the synth library tests (real engines, real audio)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from synth import Synthesizer  # noqa: E402


@pytest.fixture(scope="session")
def synthesizer() -> Synthesizer:
    s = Synthesizer(device="cpu", threads=min(2, os.cpu_count() or 1))
    s.load(["en_US-joe-medium", "espeak-en-us", "espeak-cmn", "espeak-yue"])
    return s


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
