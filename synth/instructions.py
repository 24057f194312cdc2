"""Natural-language style instructions (English and Chinese) -> engine controls.

``parse_instructions("speak a bit slower, louder")`` gives relative controls
(a speed factor, pitch and volume deltas, a pause factor, a language) plus the
phrases that were understood and those that ask for something no control can
express (emotions, whispering). The synthesiser then reports, per engine, what
it applied and what it could not; nothing is silently dropped.
The phrase table in docs/instructions.md is tested row by row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Magnitudes for "a bit" / normal / "much".
_SPEED = {1: 1.1, 2: 1.25, 3: 1.5}
_PITCH = {1: 1.0, 2: 2.0, 3: 4.0}
_VOLUME = {1: 2.0, 2: 4.0, 3: 6.0}
_PAUSE = {1: 1.25, 2: 1.5, 3: 2.0}


@dataclass
class Instructions:
    speed: float = 1.0  # multiplier
    pitch: float = 0.0  # semitones to add
    volume: float = 0.0  # dB to add
    pause: float = 1.0  # multiplier on the silence between sentences
    language: str | None = None  # eSpeak language code: "yue", "cmn", "en-us"
    understood: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)  # e.g. "emotion: happy"
    unrecognised: list[str] = field(default_factory=list)

    def as_row(self) -> dict[str, str]:
        """The non-default fields in the docs table notation (``speed=0.80`` ...)."""
        row: dict[str, str] = {}
        if abs(self.speed - 1.0) > 1e-9:
            row["speed"] = f"{self.speed:.2f}"
        if self.pitch:
            row["pitch"] = f"{self.pitch:+g}"
        if self.volume:
            row["volume"] = f"{self.volume:+g}"
        if abs(self.pause - 1.0) > 1e-9:
            row["pause"] = f"{self.pause:.2f}"
        if self.language:
            row["language"] = self.language
        if self.unsupported:
            row["unsupported"] = ",".join(self.unsupported)
        return row


@dataclass(frozen=True)
class _Lexicon:
    """The words of one language: degree and negation words, control rules, emotions."""

    much: re.Pattern[str]
    bit: re.Pattern[str]
    negation: re.Pattern[str]
    # (pattern, dimension, direction); first match per dimension in a clause wins.
    rules: list[tuple[re.Pattern[str], str, int]]
    emotions: re.Pattern[str]

    def degree(self, clause: str) -> int:
        if self.much.search(clause):
            return 3
        if self.bit.search(clause):
            return 1
        return 2


# Language names in either script: "in Cantonese" and "用粤语说" ask for the same voice language.
_LANGUAGES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bcantonese\b|粤语|广东话|廣東話|粵語|白话"), "yue"),
    (re.compile(r"\b(mandarin|chinese)\b|普通话|國語|国语|汉语|中文|华语"), "cmn"),
    (re.compile(r"\benglish\b|英语|英文"), "en-us"),
]

_ENGLISH = _Lexicon(
    much=re.compile(r"\b(much|a lot|lots|very|really|way|extremely|super|significantly|far)\b"),
    bit=re.compile(r"\b(a bit|a little|a tad|bit|little|slightly|somewhat|marginally)\b"),
    negation=re.compile(r"\b(not|don't|dont|do not|no|never)\b"),
    rules=[
        (re.compile(r"\b(slow|slowly|slower|slowed)\b"), "speed", -1),
        (re.compile(r"\b(fast|faster|quick|quickly|quicker|rapid|rapidly|speed up|hurry)\b"), "speed", +1),
        (
            re.compile(
                r"\b(higher|high)[- ]?(pitch|pitched|voice|tone)|\bpitch (it )?up\b|\braise the pitch\b"
            ),
            "pitch",
            +1,
        ),
        (
            re.compile(
                r"\b(lower|low|deeper|deep)[- ]?(pitch|pitched|voice|tone)|\bpitch (it )?down\b|\blower the pitch\b"
            ),
            "pitch",
            -1,
        ),
        (re.compile(r"\b(loud|louder|loudly|volume up|raise the volume)\b"), "volume", +1),
        (
            re.compile(r"\b(quiet|quieter|quietly|soft|softer|softly|volume down|lower the volume)\b"),
            "volume",
            -1,
        ),
        (re.compile(r"\b(pause longer|longer pauses?|more pauses?|pause more)\b"), "pause", +1),
        (re.compile(r"\b(pause shorter|shorter pauses?|fewer pauses?|pause less)\b"), "pause", -1),
    ],
    emotions=re.compile(
        r"\b(happy|happily|sad|sadly|angry|angrily|excited|cheerful|cheerfully|calm|calmly|whisper|whispering|"
        r"warm|warmly|serious|seriously|friendly|emotional|gentle|gently|sarcastic|scared|nervous)\b"
    ),
)
_CHINESE = _Lexicon(
    much=re.compile(r"(很|非常|特别|多了|得多|超级|极|太)"),
    bit=re.compile(r"(一点|一些|稍微|稍|有点|点儿|些)"),
    negation=re.compile(r"(不要|别|不|勿)"),
    rules=[
        (re.compile(r"(停顿|停顿时间|间隔|句间停顿)(长|久|多)|(长|久)(一点|些)?的?停顿"), "pause", +1),
        (re.compile(r"(停顿|间隔|句间停顿)(短|少)|(短|少)(一点|些)?的?停顿"), "pause", -1),
        (re.compile(r"慢|缓"), "speed", -1),
        (re.compile(r"快|迅速"), "speed", +1),
        (re.compile(r"(音调|声调|音高|调子|声音)(高|尖|升)|(高|尖)音|提高音调|(高|尖)一?点"), "pitch", +1),
        (re.compile(r"(音调|声调|音高|调子|声音)(低|沉|降)|低沉|低音|降低音调|(低|沉)一?点"), "pitch", -1),
        (re.compile(r"大声|响亮|响|音量(大|高)|提高音量|大点声"), "volume", +1),
        (re.compile(r"小声|轻声|音量(小|低)|降低音量|轻"), "volume", -1),
    ],
    emotions=re.compile(
        r"(开心|高兴|快乐|悲伤|伤心|难过|生气|愤怒|激动|温柔|兴奋|耳语|悄悄|严肃|热情|害怕|紧张)"
    ),
)

_EMOTION_CANON = {
    "happily": "happy",
    "sadly": "sad",
    "angrily": "angry",
    "cheerfully": "cheerful",
    "calmly": "calm",
    "whispering": "whisper",
    "warmly": "warm",
    "seriously": "serious",
    "gently": "gentle",
    "开心": "happy",
    "高兴": "happy",
    "快乐": "happy",
    "悲伤": "sad",
    "伤心": "sad",
    "难过": "sad",
    "生气": "angry",
    "愤怒": "angry",
    "激动": "excited",
    "兴奋": "excited",
    "温柔": "gentle",
    "耳语": "whisper",
    "悄悄": "whisper",
    "严肃": "serious",
    "热情": "warm",
    "害怕": "scared",
    "紧张": "nervous",
}

_FILLER = re.compile(
    r"(?:\s*(?:please|sound|speak|say|read|it|this|in|a|the|voice|tone|用|说|讲|读|请|一下|的|地))*\s*"
)
_CJK = re.compile(r"[\u3400-\u9fff]")
_SPLIT_EN = re.compile(r"\s*(?:[,;+/]|\band\b|\bthen\b|\bbut\b)\s*")
_SPLIT_ZH = re.compile(r"\s*(?:[,;+/，、；。！!\s]|和|并且|然后|同时|而且)\s*")


def _apply(result: Instructions, dimension: str, direction: int, degree: int) -> None:
    if dimension == "speed":
        step = _SPEED[degree]
        result.speed *= step if direction > 0 else 1.0 / step
    elif dimension == "pitch":
        result.pitch += direction * _PITCH[degree]
    elif dimension == "volume":
        result.volume += direction * _VOLUME[degree]
    elif dimension == "pause":
        step = _PAUSE[degree]
        result.pause *= step if direction > 0 else 1.0 / step


def parse_instructions(text: str | None) -> Instructions:
    """Parse English and/or Chinese style instructions into relative controls.

    Negation ("not too fast", "不要太快") turns the request into a small step
    the other way; degree words ("a bit"/"much", "一点"/"很") scale the step.
    """
    result = Instructions()
    if not text or not text.strip():
        return result
    lowered = text.lower().replace("’", "'")
    zh_all = bool(_CJK.search(lowered))
    clauses = [c for c in (_SPLIT_ZH if zh_all else _SPLIT_EN).split(lowered) if c and c.strip()]
    for clause in clauses:
        lexicon = _CHINESE if _CJK.search(clause) else _ENGLISH
        matched = False
        seen: set[str] = set()
        # Emotion words first, so 快乐 (happy) is not read as 快 (fast).
        for m in lexicon.emotions.finditer(clause):
            word = _EMOTION_CANON.get(m.group(0), m.group(0))
            label = f"emotion: {word}"
            if label not in result.unsupported:
                result.unsupported.append(label)
            matched = True
        plain = lexicon.emotions.sub(" ", clause)
        for pattern, dimension, direction in lexicon.rules:
            if dimension in seen or not pattern.search(plain):
                continue
            seen.add(dimension)
            matched = True
            degree = lexicon.degree(plain)
            if lexicon.negation.search(plain):
                direction, degree = -direction, 1
            _apply(result, dimension, direction, degree)
        for pattern, lang in _LANGUAGES:
            if pattern.search(plain):
                result.language = lang
                matched = True
                break
        if matched:
            result.understood.append(clause.strip())
        elif not _FILLER.fullmatch(clause.strip()):
            result.unrecognised.append(clause.strip())
    result.speed = round(result.speed, 6)
    return result


__all__ = ["Instructions", "parse_instructions"]
