"""Captions from a job's timestamps: SRT and WebVTT, one cue per sentence or per word.

Written once for the API (``GET /api/v1/speech/{id}/timestamps?format=srt``) and the dashboard's
caption downloads. ``data`` is a job's timestamps as stored (``JobTimestamps``: ``words`` and
``sentences``, each with ``start``, ``end`` and ``text``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any


def _clock(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=max(0.0, float(seconds)))


def _cues(data: dict[str, Any], level: str) -> list[tuple[float, float, str]]:
    entries = data["words"] if level == "word" else data["sentences"]
    cues = []
    for e in entries:
        end = max(float(e["end"]), float(e["start"]) + 0.001)  # a cue of no length is dropped by players
        cues.append((float(e["start"]), end, str(e["text"]).strip() or "…"))
    return cues


def srt_captions(data: dict[str, Any], level: str = "sentence") -> str:
    import srt

    subtitles = [
        srt.Subtitle(i, _clock(start), _clock(end), text)
        for i, (start, end, text) in enumerate(_cues(data, level), 1)
    ]
    return str(srt.compose(subtitles, reindex=False))


def _vtt_time(seconds: float) -> str:
    ms = int(round(max(0.0, seconds) * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def vtt_captions(data: dict[str, Any], level: str = "sentence") -> str:
    import webvtt

    vtt = webvtt.WebVTT()
    for start, end, text in _cues(data, level):
        # "-->" in a cue's text would end its timing line early: WebVTT has no escape for it.
        vtt.captions.append(webvtt.Caption(_vtt_time(start), _vtt_time(end), text.replace("-->", "->")))
    return str(vtt.content)
