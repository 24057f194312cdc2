"""Pronunciation dictionaries applied to a request's text before it is cut into sentences.

A :class:`Rule` maps a grapheme (a whole word or phrase, case-sensitive or
not) to an alias (plain text read instead) or to phonemes in ARPAbet, pinyin
or IPA. Phonemes become the inline annotations :mod:`synth.text` already
parses (``[M][AY0][N][UW1][T]``, ``[hao3]``), so they reach each engine
through the annotation path it already has and never as raw ``[[...]]``
engine markup, which the text layer neutralises. IPA is converted to ARPAbet
(the English inventory both engines speak through that path); IPA outside it
is refused when the rule is made (:func:`check_rule`).

:func:`apply_lexicons` rewrites the text once, before sentences (and the
sentence cache's keys) are made, so a new dictionary version never meets
audio made for the old one. It returns the new text, where each replacement
came from in the submitted text (:meth:`Rewrite.to_source`, for offsets back
to what the client sent), and the report: how many rules of which dictionary
were applied, and which matched a word but could not be applied by the
voice's engine (the same applied / not applied lists as instructions).
Standard library only.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass, field

from synth.engines.base import ARPABET_IPA
from synth.text import ARPABET_VOWELS, iter_segments

ALPHABETS = ("arpabet", "pinyin", "ipa")
MAX_GRAPHEME_CHARS = 100
MAX_ALIAS_CHARS = 200
MAX_PHONEMES_CHARS = 200


class RuleError(ValueError):
    """A rule that cannot be stored: what is wrong, in words for the tenant."""


@dataclass(frozen=True)
class Rule:
    grapheme: str
    alias: str | None = None
    phonemes: str | None = None
    alphabet: str | None = None  # with phonemes: arpabet | pinyin | ipa
    case_sensitive: bool = False

    def describe(self) -> str:
        if self.alias is not None:
            return f"{self.grapheme!r} -> {self.alias!r}"
        return f"{self.grapheme!r} -> /{self.phonemes}/ ({self.alphabet})"


@dataclass(frozen=True)
class Lexicon:
    """One pinned dictionary version, rules in the order they were written."""

    id: str
    version: int
    name: str
    rules: tuple[Rule, ...]


# --------------------------------------------------------------------------- phonemes -> annotation

# IPA -> ARPAbet: the inverse of the table the engines use, plus the usual spellings of the same sounds.
_IPA_ARPABET: dict[str, str] = {ipa: arpa for arpa, ipa in ARPABET_IPA.items()}
_IPA_ARPABET.update(
    {
        "ɑ": "AA",
        "ɒ": "AA",
        "ɔ": "AO",
        "ɜ": "ER",
        "ɝ": "ER",
        "i": "IY",
        "u": "UW",
        "e": "EY",
        "o": "OW",
        "a": "AA",
        "ɐ": "AH",
        "ə": "AH",
        "ɚ": "ER",
        "g": "G",
        "r": "R",
        "ɾ": "T",
        "ʍ": "W",
        "x": "HH",
        "əʊ": "OW",
        "eə": "EH",
        "ɪə": "IH",
    }
)
_IPA_KEYS = sorted(_IPA_ARPABET, key=len, reverse=True)
_IPA_IGNORED = frozenset(" .\u0361\u035c‿ːˑ")  # spaces, syllable dots, tie bars, length (folded in)
_UNSTRESSED = {"ə": "AH0", "ɚ": "ER0", "ɐ": "AH0"}


def ipa_to_arpabet(ipa: str) -> list[str]:
    """ARPAbet tokens for an IPA string of English sounds (raises RuleError naming a symbol outside them)."""
    text = unicodedata.normalize("NFC", ipa.strip().strip("/[]"))
    out: list[str] = []
    stress = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "ˈ'":
            stress, i = "1", i + 1
            continue
        if ch in "ˌ,":
            stress, i = "2", i + 1
            continue
        key = next((k for k in _IPA_KEYS if text.startswith(k, i)), None)
        if key is None:
            if ch in _IPA_IGNORED:
                i += 1
                continue
            raise RuleError(f"IPA symbol {ch!r} (U+{ord(ch):04X}) has no equivalent the engines can speak")
        i += len(key)
        while i < len(text) and text[i] == "ː":  # "iː" and "i" are the same vowel here
            i += 1
        arpa = _IPA_ARPABET[key]
        if arpa in ARPABET_VOWELS:
            if stress:
                arpa, stress = arpa + stress, ""
            elif key in _UNSTRESSED:
                arpa = _UNSTRESSED[key]
        out.append(arpa)
    if not out:
        raise RuleError("the IPA transcription is empty")
    return out


def annotation(rule: Rule) -> str:
    """The inline annotation a phoneme rule stands for (raises RuleError when it is not valid)."""
    phonemes = (rule.phonemes or "").strip()
    if rule.alphabet == "ipa":
        tokens = ipa_to_arpabet(phonemes)
        kind = "arpabet"
    elif rule.alphabet == "arpabet":
        tokens = phonemes.upper().replace("[", " ").replace("]", " ").split()
        kind = "arpabet"
    elif rule.alphabet == "pinyin":
        tokens = phonemes.replace("[", " ").replace("]", " ").split()
        kind = "pinyin"
    else:
        raise RuleError(f"unknown phoneme alphabet {rule.alphabet!r}; use one of {', '.join(ALPHABETS)}")
    if not tokens:
        raise RuleError("the phonemes are empty")
    text = "".join(f"[{t}]" for t in tokens)
    segments = list(iter_segments(text))
    if len(segments) != 1 or segments[0].kind != kind:
        raise RuleError(f"{phonemes!r} is not valid {rule.alphabet}")
    return text


def check_rule(rule: Rule) -> None:
    """Raise RuleError when ``rule`` cannot be stored (the web tier calls this for every rule)."""
    g = rule.grapheme
    if not g or not g.strip() or g != g.strip():
        raise RuleError("the grapheme must be a word without surrounding spaces")
    if len(g) > MAX_GRAPHEME_CHARS:
        raise RuleError(f"the grapheme is longer than {MAX_GRAPHEME_CHARS} characters")
    if not any(unicodedata.category(c)[0] in "LN" for c in g):
        raise RuleError("the grapheme has no letter or digit")
    for name, value in (("grapheme", g), ("alias", rule.alias or "")):
        if any(c in "[]<>" or unicodedata.category(c) in ("Cc", "Cs", "Co") for c in value):
            raise RuleError(f"the {name} may not hold brackets, angle brackets or control characters")
    if (rule.alias is None) == (rule.phonemes is None):
        raise RuleError("a rule has either an alias or phonemes, not both")
    if rule.alias is not None:
        if not rule.alias.strip() or len(rule.alias) > MAX_ALIAS_CHARS:
            raise RuleError(f"the alias must be 1 to {MAX_ALIAS_CHARS} characters")
        return
    if len(rule.phonemes or "") > MAX_PHONEMES_CHARS:
        raise RuleError(f"the phonemes are longer than {MAX_PHONEMES_CHARS} characters")
    annotation(rule)


# --------------------------------------------------------------------------- applying


@dataclass(frozen=True)
class Replacement:
    """One word rewritten: ``source`` span in the submitted text, ``out`` span in the new one."""

    source_start: int
    source_end: int
    out_start: int
    out_end: int


@dataclass
class Rewrite:
    text: str
    replacements: list[Replacement] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    # Per dictionary: {"id", "version", "name", "rules_applied", "replacements"}.
    dictionaries: list[dict[str, object]] = field(default_factory=list)

    def to_source(self, position: int) -> int:
        """The submitted text's position for a position in :attr:`text`.

        Outside a replacement the two texts differ by a constant shift; inside one
        (an alias or annotation standing for a word) it maps to the word's start,
        and a replacement's end to the word's end.
        """
        starts = [r.out_start for r in self.replacements]
        k = bisect.bisect_right(starts, position) - 1
        if k < 0:
            return position
        r = self.replacements[k]
        if position >= r.out_end:
            return r.source_end + (position - r.out_end)
        return r.source_start

    def source_spans(self) -> list[tuple[int, int]]:
        """Per character of :attr:`text`, the span of the submitted text it stands for.

        The form of synth.normalize's ``Mapped`` spans: every character of a replacement
        spans the whole word it replaced, so offsets computed on the rewritten text
        map back to what the client sent.
        """
        spans: list[tuple[int, int]] = []
        shift = 0
        pos = 0
        for r in self.replacements:
            spans.extend((i + shift, i + shift + 1) for i in range(pos, r.out_start))
            spans.extend([(r.source_start, r.source_end)] * (r.out_end - r.out_start))
            pos = r.out_end
            shift = r.source_end - r.out_end
        spans.extend((i + shift, i + shift + 1) for i in range(pos, len(self.text)))
        return spans


_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_BRACKETED = re.compile(r"\[[^\[\]]*\]|\[\[.*?\]\]")


def _alternative(grapheme: str) -> str:
    """The grapheme as a whole word: a word boundary at an end that is a (non-Han) word character."""
    head = r"(?<!\w)" if re.match(r"\w", grapheme[0]) and not _CJK.match(grapheme[0]) else ""
    tail = r"(?!\w)" if re.match(r"\w", grapheme[-1]) and not _CJK.match(grapheme[-1]) else ""
    return head + re.escape(grapheme) + tail


def _applicable(rule: Rule, english: bool, chinese: bool) -> str | None:
    """Why the voice's engine cannot apply ``rule``; None when it can."""
    if rule.alias is not None:
        return None
    if rule.alphabet in ("arpabet", "ipa") and not english:
        return f"{rule.alphabet} phonemes need an English voice"
    if rule.alphabet == "pinyin" and not chinese:
        return "pinyin needs a Chinese voice"
    return None


def apply_lexicons(text: str, lexicons: list[Lexicon], *, english: bool, chinese: bool) -> Rewrite:
    """Rewrite ``text`` with the rules of ``lexicons`` (the first dictionary naming a word wins).

    Only plain text is rewritten: annotations and bracketed text are left as typed.
    ``english`` / ``chinese``: what the voice speaks (which phoneme alphabets it can take).
    """
    if not lexicons:
        return Rewrite(text)
    # word (lower-cased) -> [(lexicon index, rule)] in precedence order
    index: dict[str, list[tuple[int, Rule]]] = {}
    for li, lex in enumerate(lexicons):
        for rule in lex.rules:
            index.setdefault(rule.grapheme.lower(), []).append((li, rule))
    for candidates in index.values():
        # within a dictionary a case-sensitive rule is the more specific one
        candidates.sort(key=lambda c: (c[0], not c[1].case_sensitive))
    graphemes = sorted({r.grapheme for lex in lexicons for r in lex.rules}, key=len, reverse=True)
    pattern = re.compile("|".join(_alternative(g) for g in graphemes), re.IGNORECASE)

    used: list[set[Rule]] = [set() for _ in lexicons]
    counts = [0] * len(lexicons)
    refused: dict[Rule, tuple[int, str]] = {}
    out: list[str] = []
    replacements: list[Replacement] = []
    length = 0
    pos = 0
    for seg in iter_segments(text):
        if seg.kind != "text":
            continue
        masked = [(m.start(), m.end()) for m in _BRACKETED.finditer(seg.text)]
        for m in pattern.finditer(seg.text):
            if any(a < m.end() and m.start() < b for a, b in masked):
                continue
            word = m.group(0)
            chosen: tuple[int, Rule] | None = None
            for li, rule in index.get(word.lower(), []):
                if rule.case_sensitive and rule.grapheme != word:
                    continue
                why = _applicable(rule, english, chinese)
                if why is None:
                    chosen = (li, rule)
                    break
                refused.setdefault(rule, (li, why))
            if chosen is None:
                continue
            li, rule = chosen
            start, end = seg.start + m.start(), seg.start + m.end()
            new = rule.alias if rule.alias is not None else annotation(rule)
            if rule.alias is None:
                # An annotation touching a bracket would run into it ("[M]...[T][x]" is one run).
                if start > 0 and text[start - 1] == "]":
                    new = " " + new
                if end < len(text) and text[end] == "[":
                    new += " "
            out.append(text[pos:start])
            length += start - pos
            replacements.append(Replacement(start, end, length, length + len(new)))
            out.append(new)
            length += len(new)
            pos = end
            used[li].add(rule)
            counts[li] += 1
    out.append(text[pos:])
    result = Rewrite("".join(out), replacements)
    for li, lex in enumerate(lexicons):
        label = f"dictionary {lex.name} v{lex.version}"
        result.dictionaries.append(
            {
                "id": lex.id,
                "version": lex.version,
                "name": lex.name,
                "rules_applied": len(used[li]),
                "replacements": counts[li],
            }
        )
        if used[li]:
            result.applied.append(f"{label}: {len(used[li])} rules, {counts[li]} words")
    for rule, (li, why) in refused.items():
        if rule not in used[li]:
            lex = lexicons[li]
            result.not_applied.append(f"dictionary {lex.name} v{lex.version} rule {rule.describe()}: {why}")
    return result


__all__ = [
    "ALPHABETS",
    "Lexicon",
    "Replacement",
    "Rewrite",
    "Rule",
    "RuleError",
    "annotation",
    "apply_lexicons",
    "check_rule",
    "ipa_to_arpabet",
]
