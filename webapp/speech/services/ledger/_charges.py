"""The rules of money, private to the ledger: what a charge is made of, and the quota levels.

Nothing outside ``webapp.speech.services.ledger`` imports this module (an
import-linter contract): callers state facts (a completion, a delivery to a
client that left, a failure) and the ledger turns them into parts here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.conf import settings


class PartKind(StrEnum):
    """What a charged part of a job's characters was."""

    FRESH = "fresh"  # synthesised for this job and delivered whole
    DELIVERED = "delivered"  # handed to a client before a cancel or disconnect
    # Audio past TTS_AUDIO_SECONDS_PER_CHAR per character of the parts above, charged by its
    # seconds (speed 0.25, long pauses): the one part not capped by the reservation.
    AUDIO_SECONDS = "audio_seconds"
    # Sentences served from the tenant's sentence cache: charged at the plan's
    # cached_character_price (``covers`` records how many characters they were).
    CACHED = "cached"


@dataclass(frozen=True)
class Part:
    """A charged part; ``characters`` None: all of the reservation not charged by an earlier part."""

    kind: PartKind
    characters: int | None = None
    seconds: float | None = None  # AUDIO_SECONDS: the audio's length, charged beyond the parts before it
    # The characters the part stands for when it charges fewer (CACHED): they count towards the
    # bound of audio per character as if charged, so a discount is never taken back as audio seconds.
    covers: int | None = None


def cached_part(characters: int, price: float) -> Part:
    """Characters served from the sentence cache, at ``price`` (0.0 .. 1.0) of a fresh one, rounded up."""
    price = min(1.0, max(0.0, float(price)))
    return Part(PartKind.CACHED, math.ceil(characters * price - 1e-9), covers=characters)


def audio_seconds_part(audio_seconds: float) -> Part:
    """What ``audio_seconds`` of audio cost beyond the characters of the parts before it.

    Cheap characters can ask for much compute (speed 0.25, long pauses): each
    character pays for at most TTS_AUDIO_SECONDS_PER_CHAR seconds of audio, and
    audio past that is charged one character per that many seconds.
    """
    return Part(PartKind.AUDIO_SECONDS, seconds=audio_seconds)


def completion(
    duration_seconds: float, cached: int = 0, characters: int = 0, price: float = 1.0
) -> tuple[Part, ...]:
    """A completion's charge: the whole text, and audio past the bound per character by its seconds.

    Of a job that found ``cached`` of its ``characters`` in the sentence cache, those are
    charged at the plan's ``price`` for them, the rest fresh.
    """
    audio = audio_seconds_part(duration_seconds)
    cached = min(max(0, cached), characters)
    if not cached:
        return (Part(PartKind.FRESH), audio)
    return (Part(PartKind.FRESH, characters - cached), cached_part(cached, price), audio)


def delivery(characters: int, seconds: float) -> tuple[Part, ...]:
    """What streams handed to clients: their sentences' characters, and audio past the bound."""
    return (Part(PartKind.DELIVERED, int(characters)), audio_seconds_part(float(seconds)))


def _beyond_the_bound(part: Part, charged: int) -> int:
    if part.seconds is None:
        return max(0, part.characters or 0)
    per_char = settings.TTS_AUDIO_SECONDS_PER_CHAR
    if per_char <= 0 or part.seconds <= 0:
        return 0
    return max(0, math.floor(part.seconds / per_char) - charged)


def tally(reserved: int, parts: Iterable[Part]) -> tuple[int, list[dict[str, Any]]]:
    """(characters charged, the parts as recorded on the charge) of ``parts`` against a reservation.

    What the parts add up to is capped by the reservation, except an ``AUDIO_SECONDS``
    part (audio past the bound per character), which may take the tenant past its quota.
    """
    recorded: list[dict[str, Any]] = []
    room, beyond, covered = reserved, 0, 0
    for part in parts:
        if part.kind == PartKind.AUDIO_SECONDS:
            take = _beyond_the_bound(part, covered + beyond)
            beyond += take
        else:
            take = room if part.characters is None else max(0, min(part.characters, room))
            room -= take
            covered += take if part.covers is None else max(take, part.covers)
        if part.covers:  # recorded also when free: the usage splits fresh from cached characters
            recorded.append({"kind": str(part.kind), "characters": take, "covers": part.covers})
        elif take:
            recorded.append({"kind": str(part.kind), "characters": take})
    return reserved - room + beyond, recorded


# --------------------------------------------------------------------- quota levels

# Percent of the plan's monthly characters at which the tenant is told (the owners' e-mail and the
# usage.threshold webhook event), each once a month.
QUOTA_LEVELS = (80, 100)

# The highest level the month's characters reach with a charge of %(charged)s, as SQL over the
# usage row ``u`` and the plan ``p`` (the settlement's UPDATE marks it in quota_level_announced).
LEVEL_AFTER_SQL = " ".join(
    f"WHEN (u.characters_used + %(charged)s) * 100 >= p.monthly_characters * {level} THEN {level}"
    for level in sorted(QUOTA_LEVELS, reverse=True)
)


def levels_crossed(before: int, after: int) -> tuple[int, ...]:
    """The levels above the one announced ``before`` and up to the one reached ``after``."""
    return tuple(level for level in QUOTA_LEVELS if before < level <= after)


def highest_level(percent: float) -> int:
    """The highest level ``percent`` of the month reaches (0: none)."""
    return max([level for level in QUOTA_LEVELS if percent >= level], default=0)
