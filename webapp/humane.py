"""Durations for people, one way everywhere: the dashboard's tables and the operator console's."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """Seconds as "0.8 s", "42 s", "3 min 05 s", "1 h 02 min", "3 d 01 h" ("" if not a duration)."""
    if not math.isfinite(seconds) or seconds < 0:
        return ""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days:,} d {hours:02d} h"
