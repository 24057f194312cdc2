"""Speakable units: text that arrives piece by piece (an LLM writing), cut where it can be spoken.

A realtime session (webapp/speech/api/session_socket.py) feeds each context's text here as it
arrives and synthesises every unit this returns. The policy (docs/api.md, "Realtime sessions"):

* a unit ends at a sentence end (``.``, ``!``, ``?``, ``…`` and their full-width forms, with any
  closing quotes or brackets) once whitespace follows it: "3.5" or "e.g." mid-stream is not cut
  before the next character shows what it is;
* or at a clause boundary (``,`` ``;`` ``:`` or a dash, then whitespace) once enough text waits:
  ``first_clause_chars`` for the first unit after a flush (the listener is waiting: speak early),
  ``clause_chars`` for later ones (longer units sound more natural and cost fewer requests);
* or, with no boundary at all, at the last whitespace before ``max_chars``;
* a flush makes whatever waits one unit.

Offsets count characters of the context's text as the client sent it (its first character is
0), so a unit's words can be placed in that text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SENTENCE_END = re.compile(r"[.!?…。！？]+[\"'”’)\]]*(?=\s)")
_CLAUSE_END = re.compile(r"(?:[,;:，；：]|\s[-–—])[\"'”’)\]]*(?=\s)")
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class CutPolicy:
    first_clause_chars: int = 24
    clause_chars: int = 100
    max_chars: int = 250


@dataclass(frozen=True)
class Unit:
    text: str
    start: int  # offset of text[0] in the context's text
    end: int  # offset just past its last character

    @property
    def chars(self) -> int:
        return len(self.text)


class UnitCutter:
    """One context's buffer: ``add`` text as it arrives, ``flush`` at the client's word, ``clear`` on barge-in."""

    def __init__(self, policy: CutPolicy | None = None) -> None:
        self.policy = policy or CutPolicy()
        self.buffer = ""
        self.offset = 0  # offset of buffer[0] in the context's text
        self.cut_since_flush = 0

    @property
    def waiting(self) -> int:
        """Characters buffered, not yet in a unit."""
        return len(self.buffer)

    def add(self, text: str) -> list[Unit]:
        self.buffer += text
        units: list[Unit] = []
        while (unit := self._next()) is not None:
            units.append(unit)
        return units

    def flush(self) -> list[Unit]:
        units = self.add("")
        if self.buffer.strip():
            units.append(self._take(len(self.buffer)))
        else:
            self._take(len(self.buffer))
        self.cut_since_flush = 0
        return [u for u in units if u.text]

    def clear(self) -> int:
        """Drop what waits; returns how many characters were dropped (never spoken, never charged)."""
        dropped = len(self.buffer)
        self._take(dropped)
        self.cut_since_flush = 0
        return dropped

    def _next(self) -> Unit | None:
        buffer = self.buffer
        if not buffer.strip():
            return None
        sentence = _SENTENCE_END.search(buffer)
        if sentence is not None and sentence.end() <= self.policy.max_chars:
            return self._take(sentence.end())
        enough = self.policy.first_clause_chars if self.cut_since_flush == 0 else self.policy.clause_chars
        cut = 0
        for clause in _CLAUSE_END.finditer(buffer):
            if clause.end() > self.policy.max_chars:
                break
            if clause.end() >= enough:
                cut = clause.end()
                break
        if cut:
            return self._take(cut)
        if len(buffer) > self.policy.max_chars:
            spaces = [m.start() for m in _SPACE.finditer(buffer, 0, self.policy.max_chars)]
            return self._take(spaces[-1] if spaces and spaces[-1] > 0 else self.policy.max_chars)
        return None

    def _take(self, n: int) -> Unit:
        """The first ``n`` characters as a unit (its surrounding whitespace left out of its text)."""
        piece, self.buffer = self.buffer[:n], self.buffer[n:]
        lead = len(piece) - len(piece.lstrip())
        text = piece.strip()
        unit = Unit(text, self.offset + lead, self.offset + lead + len(text))
        self.offset += n
        if text:
            self.cut_since_flush += 1
        return unit


__all__ = ["CutPolicy", "Unit", "UnitCutter"]
