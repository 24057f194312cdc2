"""The pronunciation dictionary versions a job pins, in the shape the lifecycle takes them.

Resolved by the submission service (and an operator's Retry); the lifecycle keeps
``record`` on the job and calls ``confirm`` under the tenant lock, knowing nothing
of the dictionaries package.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webapp.dictionaries import services as dictionaries
from webapp.dictionaries.models import DictionaryVersion


@dataclass(frozen=True)
class DictionaryPins:
    """``versions`` (rows) a job pins; ``record``: what the job keeps of them (readable after they
    are gone); ``confirm``: raises if one was deleted meanwhile (called under the tenant lock a
    dictionary's deletion takes too)."""

    versions: list[Any]
    record: list[dict[str, Any]]
    confirm: Callable[[], None]


NO_PINS = DictionaryPins([], [], lambda: None)


def dictionary_pins(versions: list[DictionaryVersion]) -> DictionaryPins:
    """What a job pins of these versions."""
    if not versions:
        return NO_PINS
    return DictionaryPins(
        versions, dictionaries.pin_record(versions), functools.partial(dictionaries.require_present, versions)
    )
