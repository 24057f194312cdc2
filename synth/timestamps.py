"""Word timestamps: which stretch of a sentence's audio speaks which characters of the submitted text.

An engine reports, per sentence it synthesised, a list of :data:`WordTiming` dicts (plain data,
JSON-able: the sentence cache stores them as they are): ``text`` as spoken (after normalisation),
``start``/``end`` in seconds from the sentence's first sample, ``char_start``/``char_end`` into the
sentence's text as submitted (a number spelled out maps every spoken word back to its digits, an
annotation to its whole bracket run, through :class:`synth.normalize.Mapped`). The Synthesizer
puts them on the job's time line and text (:class:`Timeline`).

Piper (onnxruntime) knows how many samples each phoneme got (the model patched to expose its
durations, synth.engines.piper); eSpeak's phonemizer does not say where one word's phonemes end
when it runs words together ("of the" -> ``ʌvðə``, "forty-two" -> one word), so the words of the
text are matched to the phoneme words by their phoneme counts (:func:`align`), and a phoneme word
that speaks several text words is shared among them by their counts. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from synth.normalize import Mapped

WordTiming = dict[str, Any]  # {"text", "start", "end", "char_start", "char_end"}

# What Piper's phoneme maps hold that is no sound of a word: pauses and the utterance's edges.
PAUSE_PHONEMES = frozenset(" .,;:!?¡¿—…\"«»“”()-'^$_")
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_MERGE_PENALTY = 1.5  # per extra word in a group: prefer one text word to one phoneme word


@dataclass(frozen=True)
class SpokenWord:
    """A word of the engine's input and the characters of the submitted sentence it came from."""

    text: str
    char_start: int
    char_end: int
    phonemes: int = 0  # expected phoneme count when spoken alone (0: unknown, counted as 1)


def words_of(mapped: Mapped) -> list[SpokenWord]:
    """The words of normalised text (letters and digits, inner apostrophes; hyphens split), with spans."""
    out: list[SpokenWord] = []
    for m in _WORD.finditer(mapped.text):
        spans = mapped.spans[m.start() : m.end()]
        out.append(SpokenWord(m.group(0), min(s for s, _ in spans), max(e for _, e in spans)))
    return out


def phoneme_words(alignments: Sequence[tuple[str, int]], sample_rate: int) -> list[list[tuple[float, float]]]:
    """Per word the phonemes' (start, end) seconds, from (phoneme, samples) in order; pauses split words."""
    words: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    t = 0
    for phoneme, samples in alignments:
        start, t = t, t + samples
        if phoneme in PAUSE_PHONEMES or not phoneme.strip():
            if current:
                words.append(current)
                current = []
        elif samples > 0 or current:
            current.append((start / sample_rate, t / sample_rate))
    if current:
        words.append(current)
    return words


def align(expected: Sequence[int], actual: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Groups ``(a0, a1, b0, b1)``: text words ``a0:a1`` are spoken by phoneme words ``b0:b1``.

    A monotone alignment of up to three words a side per group, minimising the phoneme-count
    difference plus a penalty per extra word; a side may be empty (a text word not spoken, a
    phoneme word with no text word).
    """
    n, m = len(expected), len(actual)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int]]] = [[(0, 0)] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    pre_a = [0]
    for x in expected:
        pre_a.append(pre_a[-1] + max(x, 1))
    pre_b = [0]
    for x in actual:
        pre_b.append(pre_b[-1] + x)
    # A band around the diagonal: eSpeak merges or splits a few words a sentence, never many.
    band = abs(n - m) + 6
    for i in range(n + 1):
        centre = i * m // n if n else 0
        for j in range(max(0, centre - band), min(m, centre + band) + 1):
            here = cost[i][j]
            if here == inf:
                continue
            for da in range(4):
                for db in range(4):
                    if da + db == 0 or i + da > n or j + db > m:
                        continue
                    diff = abs((pre_a[i + da] - pre_a[i]) - (pre_b[j + db] - pre_b[j]))
                    c = here + diff + _MERGE_PENALTY * (max(da, 1) - 1 + max(db, 1) - 1)
                    if not da or not db:  # a word not spoken, or sound of no word: the last resort
                        c += 2 * _MERGE_PENALTY
                    if c < cost[i + da][j + db]:
                        cost[i + da][j + db] = c
                        back[i + da][j + db] = (da, db)
    if cost[n][m] == inf:  # out of the band (never seen): one group, shared by phoneme counts
        return [(0, n, 0, m)]
    groups: list[tuple[int, int, int, int]] = []
    i, j = n, m
    while i or j:
        da, db = back[i][j]
        groups.append((i - da, i, j - db, j))
        i, j = i - da, j - db
    groups.reverse()
    return groups


def _time_at(phonemes: Sequence[tuple[float, float]], x: float, end: bool) -> float:
    """The time at fractional phoneme position ``x`` (a whole ``x`` is a phoneme's start, or an end's)."""
    count = len(phonemes)
    if x <= 0:
        return phonemes[0][0]
    if x >= count:
        return phonemes[-1][1]
    k = int(x)
    frac = x - k
    if frac < 1e-9:
        return phonemes[k - 1][1] if end else phonemes[k][0]
    start, stop = phonemes[k]
    return start + frac * (stop - start)


def place(words: Sequence[SpokenWord], spoken: Sequence[Sequence[tuple[float, float]]]) -> list[WordTiming]:
    """Timings of ``words`` from the phoneme words the engine spoke (in order, never overlapping)."""
    out: list[WordTiming] = []
    last = 0.0
    for a0, a1, b0, b1 in align([w.phonemes for w in words], [len(p) for p in spoken]):
        if a0 == a1:
            continue  # sound with no word of the text (nothing to show it under)
        phonemes = [p for group in spoken[b0:b1] for p in group]
        weights = [max(w.phonemes, 1) for w in words[a0:a1]]
        total = sum(weights)
        position = 0
        for word, weight in zip(words[a0:a1], weights, strict=True):
            if phonemes:
                x0, x1 = position * len(phonemes) / total, (position + weight) * len(phonemes) / total
                start, end = _time_at(phonemes, x0, False), _time_at(phonemes, x1, True)
            else:
                start = end = last  # not spoken: an instant where it would have been
            start = max(start, last)
            end = max(end, start)
            out.append(timing(word.text, start, end, word.char_start, word.char_end))
            last = end
            position += weight
    return out


def timing(text: str, start: float, end: float, char_start: int, char_end: int) -> WordTiming:
    return {
        "text": text,
        "start": round(start, 4),
        "end": round(end, 4),
        "char_start": char_start,
        "char_end": char_end,
    }


def scaled(words: Sequence[WordTiming], factor: float) -> list[WordTiming]:
    """Times stretched by ``factor`` (a pitch shift resamples the sentence's audio)."""
    if abs(factor - 1.0) < 1e-9:
        return list(words)
    return [{**w, "start": round(w["start"] * factor, 4), "end": round(w["end"] * factor, 4)} for w in words]


class Timeline:
    """A job's words and sentences on its time line, in the text as submitted, sentence by sentence.

    ``spans`` maps each character of the text the sentences were cut from (``spoken``: the
    request's text after pronunciation dictionaries) to the span of ``source`` it stands for.
    """

    def __init__(self, source: str, spoken: str, spans: Sequence[tuple[int, int]], sample_rate: int) -> None:
        self.source = source
        self.spoken = spoken
        self.spans = spans
        self.rate = sample_rate
        self.words: list[WordTiming] = []
        self.sentences: list[dict[str, Any]] = []
        self._samples = 0
        self._pos = 0

    def _source_span(self, start: int, end: int) -> tuple[int, int]:
        if not self.spans or end <= start:
            return start, end
        return self.spans[start][0], self.spans[min(end, len(self.spans)) - 1][1]

    def gap(self, samples: int) -> None:
        self._samples += samples

    def sentence(self, chunk: str, samples: int, words: Sequence[WordTiming] | None) -> dict[str, Any]:
        """Add a sentence of ``samples`` at the rate given (its words relative to it, or None: not
        known); returns its timestamps event: ``{"sentence": {...}, "words": [...]}``."""
        at = self.spoken.find(chunk, self._pos)
        if at < 0:  # not cut from the text as given (never expected): place it after the last one
            at = self._pos
        self._pos = at + len(chunk)
        start = self._samples / self.rate
        self._samples += samples
        cs, ce = self._source_span(at, at + len(chunk))
        entry = timing(self.source[cs:ce], start, self._samples / self.rate, cs, ce)
        entry["index"] = len(self.sentences)
        self.sentences.append(entry)
        placed: list[WordTiming] = []
        for w in words or ():
            ws, we = self._source_span(at + w["char_start"], at + w["char_end"])
            word = timing(self.source[ws:we], w["start"] + start, w["end"] + start, ws, we)
            if w["text"] != word["text"]:
                word["spoken"] = w["text"]  # what the engine read: "forty" for "42"
            placed.append(word)
        self.words.extend(placed)
        return {"sentence": entry, "words": placed}

    def result(self) -> dict[str, Any]:
        return {"words": self.words, "sentences": self.sentences}


__all__ = [
    "PAUSE_PHONEMES",
    "SpokenWord",
    "Timeline",
    "WordTiming",
    "align",
    "phoneme_words",
    "place",
    "scaled",
    "timing",
    "words_of",
]
