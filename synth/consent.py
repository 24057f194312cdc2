"""TEMPORARY stub until the consent checks land (helper's branch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WordsVerdict:
    passed: bool
    heard_code: str | None
    reason: str


def consent_phrase(language: str, organization_name: str, code: str) -> str:
    digits = " ".join(code)
    return f"I consent to {organization_name} using my voice. My code is {digits}."


def check_words(samples: np.ndarray, rate: int, phrase: str, code: str) -> WordsVerdict:
    return WordsVerdict(True, code, "")


SAME_SPEAKER_THRESHOLD = 0.75


def speaker_similarity(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))
