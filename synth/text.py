"""Text the web tier checks: validation, pronunciation annotations, billable characters.

Import-light on purpose (standard library only): the web tier imports this
module to validate and bill requests without loading any engine. What only
workers need (normalisation, number expansion, sentence splitting) lives in
:mod:`synth.normalize`.

Annotations: a run of bracketed tokens stands in for one syllable or word.
``她[h][ào]干净`` is pinyin (initial + final with tone mark or tone digit);
``[M][AY0][N][UW1][T]`` is ARPAbet. Bracket runs that are neither are ordinary
text. ``[[...]]`` (engine phoneme markup) is always ordinary text too.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field

from synth.errors import AnnotationError, InvalidText

# --------------------------------------------------------------------------- annotations

ARPABET_CONSONANTS = frozenset("B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split())
ARPABET_VOWELS = frozenset("AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split())

PINYIN_INITIALS = (
    "zh",
    "ch",
    "sh",
    "b",
    "p",
    "m",
    "f",
    "d",
    "t",
    "n",
    "l",
    "g",
    "k",
    "h",
    "j",
    "q",
    "x",
    "r",
    "z",
    "c",
    "s",
    "y",
    "w",
)
PINYIN_FINALS = frozenset(
    """a o e i u v ai ei ui ao ou iu ie ve ue er an en in un vn ang eng ing ong ia iao ian iang
    iong ua uo uai uan uang van""".split()
)
_TONE_MARKS = {
    "ā": ("a", 1),
    "á": ("a", 2),
    "ǎ": ("a", 3),
    "à": ("a", 4),
    "ē": ("e", 1),
    "é": ("e", 2),
    "ě": ("e", 3),
    "è": ("e", 4),
    "ī": ("i", 1),
    "í": ("i", 2),
    "ǐ": ("i", 3),
    "ì": ("i", 4),
    "ō": ("o", 1),
    "ó": ("o", 2),
    "ǒ": ("o", 3),
    "ò": ("o", 4),
    "ū": ("u", 1),
    "ú": ("u", 2),
    "ǔ": ("u", 3),
    "ù": ("u", 4),
    "ǖ": ("v", 1),
    "ǘ": ("v", 2),
    "ǚ": ("v", 3),
    "ǜ": ("v", 4),
    "ü": ("v", 0),
}


def _pinyin_final(token: str) -> tuple[str, int] | None:
    """``"ào"`` / ``"ao4"`` -> ``("ao", 4)``; None when not a final with a tone."""
    tone = 0
    if token and token[-1] in "12345":
        tone = int(token[-1])
        token = token[:-1]
    base = []
    for ch in unicodedata.normalize("NFC", token):
        if ch in _TONE_MARKS:
            b, t = _TONE_MARKS[ch]
            if t:
                if tone:
                    return None  # two tones
                tone = t
            base.append(b)
        else:
            base.append(ch)
    final = "".join(base)
    if final not in PINYIN_FINALS or not tone:
        return None
    return final, tone


def _pinyin_syllable(token: str) -> tuple[str, str, int] | None:
    """A whole syllable in one token (``"hao3"``, ``"hǎo"``)."""
    for ini in PINYIN_INITIALS:
        if token.startswith(ini) and len(token) > len(ini):
            fin = _pinyin_final(token[len(ini) :])
            if fin:
                return ini, fin[0], fin[1]
    fin = _pinyin_final(token)
    if fin:
        return "", fin[0], fin[1]
    return None


def _as_pinyin(tokens: list[str]) -> list[str] | None:
    """Syllables as ``initial+final+tone`` strings, or None when the run is not pinyin."""
    out: list[str] = []
    pending = ""
    for tok in tokens:
        if tok in PINYIN_INITIALS:
            if pending:
                return None
            pending = tok
            continue
        syl = _pinyin_syllable(tok) if not pending else None
        fin = _pinyin_final(tok)
        if pending and fin:
            out.append(f"{pending}{fin[0]}{fin[1]}")
            pending = ""
        elif syl:
            out.append(f"{syl[0]}{syl[1]}{syl[2]}")
        else:
            return None
    if pending or not out:
        return None
    return out


def _as_arpabet(tokens: list[str]) -> list[str] | None:
    out: list[str] = []
    for tok in tokens:
        if tok in ARPABET_CONSONANTS:
            out.append(tok)
        elif tok[:-1] in ARPABET_VOWELS and tok[-1] in "012":
            out.append(tok)
        elif tok in ARPABET_VOWELS:
            out.append(tok)
        else:
            return None
    return out or None


@dataclass(frozen=True)
class Segment:
    """A piece of the input: plain ``text``, or a ``pinyin`` / ``arpabet`` annotation.

    ``text`` is the source text of the segment (for an annotation, the
    bracketed run as typed); ``tokens`` are the normalised phonetic tokens
    (``["hao4"]``, ``["M", "AY0", "N", "UW1", "T"]``); ``start`` is the
    character position in the input.
    """

    kind: str
    text: str
    start: int
    tokens: tuple[str, ...] = field(default_factory=tuple)


_BRACKET = re.compile(r"[\[\]]")


def _scan(text: str) -> Iterator[tuple[str, int, int, list[str]]]:
    """Yield ``("text"|"run"|"literal", start, end, tokens)`` in linear time.

    Raises AnnotationError for unclosed, unmatched or nested brackets.
    ``[[...]]`` with nothing bracketed inside is a ``literal`` (engine markup
    typed by a user: read as text, never obeyed).
    """
    n = len(text)
    pos = 0
    text_start = 0
    while True:
        m = _BRACKET.search(text, pos)
        if m is None:
            break
        i = m.start()
        if text[i] == "]":
            raise AnnotationError("unmatched ']'", i)
        # Literal engine markup [[ ... ]]
        if i + 1 < n and text[i + 1] == "[":
            m2 = _BRACKET.search(text, i + 2)
            if m2 is not None and text[m2.start()] == "]" and text.startswith("]]", m2.start()):
                if i > text_start:
                    yield ("text", text_start, i, [])
                end = m2.start() + 2
                yield ("literal", i, end, [])
                pos = text_start = end
                continue
            if m2 is None:
                raise AnnotationError("unclosed '['", i)
            raise AnnotationError("nested '['", i + 1 if m2.start() > i + 1 else m2.start())
        # A run of adjacent [token][token]...
        run_start = i
        tokens: list[str] = []
        j = i
        while j < n and text[j] == "[":
            m2 = _BRACKET.search(text, j + 1)
            if m2 is None:
                raise AnnotationError("unclosed '['", j)
            k = m2.start()
            if text[k] == "[":
                raise AnnotationError("nested '['", k)
            tokens.append(text[j + 1 : k])
            j = k + 1
        if run_start > text_start:
            yield ("text", text_start, run_start, [])
        yield ("run", run_start, j, tokens)
        pos = text_start = j
    if text_start < n:
        yield ("text", text_start, n, [])


def iter_segments(text: str) -> Iterator[Segment]:
    """Lazy form of :func:`parse_annotations`; adjacent text pieces are merged."""
    pending_start = -1
    pending: list[str] = []
    for kind, start, end, tokens in _scan(text):
        seg: Segment | None = None
        if kind == "run":
            py = _as_pinyin(tokens)
            if py is not None:
                seg = Segment("pinyin", text[start:end], start, tuple(py))
            else:
                ap = _as_arpabet(tokens)
                if ap is not None:
                    seg = Segment("arpabet", text[start:end], start, tuple(ap))
        if seg is None:
            if pending_start < 0:
                pending_start = start
            pending.append(text[start:end])
            continue
        if pending:
            yield Segment("text", "".join(pending), pending_start)
            pending, pending_start = [], -1
        yield seg
    if pending:
        yield Segment("text", "".join(pending), pending_start)


def parse_annotations(text: str) -> list[Segment]:
    """Split ``text`` into plain-text and annotation segments (raises AnnotationError)."""
    return list(iter_segments(text))


# --------------------------------------------------------------------------- validation


def is_speakable(ch: str) -> bool:
    """A letter or a digit: something an engine reads aloud."""
    return unicodedata.category(ch)[0] in "LN"


def billable_characters(text: str) -> int:
    """Unicode code points of ``text``, not counting the brackets of valid annotations."""
    try:
        brackets = sum(s.text.count("[") + s.text.count("]") for s in iter_segments(text) if s.kind != "text")
    except AnnotationError:
        return len(text)
    return len(text) - brackets


def validate_text(text: str, max_chars: int | None = None) -> None:
    """Raise InvalidText / AnnotationError when ``text`` cannot be synthesised."""
    if not isinstance(text, str):
        raise InvalidText("text must be a string")
    if not text or not text.strip():
        raise InvalidText("text is empty")
    speakable = False
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if cat == "Cs":
            raise InvalidText(f"text contains a lone surrogate at character position {i}")
        if cat == "Cc" and ch not in "\t\n\r":
            name = "a NUL character" if ch == "\0" else f"control character U+{ord(ch):04X}"
            raise InvalidText(f"text contains {name} at character position {i}")
        if not speakable and cat[0] in "LN":
            speakable = True
    annotated = False
    for seg in iter_segments(text):  # raises AnnotationError
        if seg.kind != "text":
            annotated = True
    if not speakable and not annotated:
        raise InvalidText("text has nothing speakable (only punctuation, symbols or emoji)")
    if max_chars is not None:
        n = billable_characters(text)
        if n > max_chars:
            raise InvalidText(f"text is {n} characters long; the limit is {max_chars}")


__all__ = [
    "Segment",
    "billable_characters",
    "is_speakable",
    "iter_segments",
    "parse_annotations",
    "validate_text",
]
