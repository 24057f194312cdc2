"""Text handling: validation, pronunciation annotations, normalisation, chunking.

Import-light on purpose (standard library only): the web tier imports this
module to validate requests without loading any engine.

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


def _is_speakable(ch: str) -> bool:
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


# --------------------------------------------------------------------------- language

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def is_chinese_language(language: str | None) -> bool:
    if not language:
        return False
    lang = language.lower().replace("_", "-")
    return lang.split("-")[0] in ("zh", "cmn", "yue", "hak", "nan", "wuu") or lang.startswith("zh")


def detect_language(text: str, default: str = "en") -> str:
    """``"zh"`` when Han characters make up a good part of the letters, else ``default``."""
    sample = text[:2000]
    han = len(_HAN.findall(sample))
    letters = sum(1 for c in sample if c.isalpha())
    if han and han * 3 >= letters:
        return "zh"
    return default


# --------------------------------------------------------------------------- normalisation

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion")
_ORD_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_MONTHS = ("January February March April May June July August September October November December").split()
_DIGIT_WORDS = _ONES[:10]


def _under_1000(n: int) -> str:
    parts = []
    if n >= 100:
        parts.append(f"{_ONES[n // 100]} hundred")
        n %= 100
    if n >= 20:
        parts.append(_TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else ""))
    elif n or not parts:
        parts.append(_ONES[n])
    return " ".join(parts)


def number_to_words(n: int) -> str:
    """Cardinal English words; numbers beyond the quadrillions are read digit by digit."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n >= 10**18:
        return " ".join(_DIGIT_WORDS[int(d)] for d in str(n))
    if n == 0:
        return "zero"
    words = []
    scale = 0
    while n:
        n, rem = divmod(n, 1000)
        if rem:
            words.append(_under_1000(rem) + (f" {_SCALES[scale]}" if scale else ""))
        scale += 1
    return " ".join(reversed(words))


def ordinal_words(n: int) -> str:
    words = number_to_words(n)
    head, _, last = words.rpartition(" ")
    if "-" in last:
        a, b = last.rsplit("-", 1)
        last = f"{a}-{_ORD_IRREGULAR.get(b, b + 'th')}"
    elif last in _ORD_IRREGULAR:
        last = _ORD_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head} {last}" if head else last


def _year_words(n: int) -> str:
    if 2000 <= n <= 2009 or n % 1000 == 0:
        return number_to_words(n)
    hi, lo = divmod(n, 100)
    if lo == 0:
        return f"{number_to_words(hi)} hundred"
    return f"{number_to_words(hi)} {'oh ' + _ONES[lo] if lo < 10 else number_to_words(lo)}"


_ABBREVIATIONS = {
    "Mr.": "Mister",
    "Mrs.": "Missus",
    "Ms.": "Miz",
    "Dr.": "Doctor",
    "Prof.": "Professor",
    "St.": "Saint",
    "Jr.": "Junior",
    "Sr.": "Senior",
    "Mt.": "Mount",
    "vs.": "versus",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
    "approx.": "approximately",
    "Inc.": "Incorporated",
    "Ltd.": "Limited",
    "Co.": "Company",
    "No.": "number",
    "Jan.": "January",
    "Feb.": "February",
    "Aug.": "August",
    "Sept.": "September",
    "Oct.": "October",
    "Nov.": "November",
    "Dec.": "December",
}
_ABBR_RE = re.compile(r"(?<![\w.])(" + "|".join(re.escape(a) for a in _ABBREVIATIONS) + r")(?!\w)")
_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "sen", "sen"),
}
_CURRENCY_RE = re.compile(r"([$€£¥])\s?(\d{1,15}(?:,\d{3})*)(?:\.(\d{1,2}))?\b")
_ISO_DATE_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_US_DATE_RE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")
_ORDINAL_RE = re.compile(r"\b(\d{1,15})(st|nd|rd|th)\b")
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s?%")
_DECIMAL_RE = re.compile(r"\b(\d{1,15})\.(\d+)\b")
_NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+")
_EN_SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at "}


def _int_words(digits: str) -> str:
    digits = digits.replace(",", "")
    if len(digits) > 18 or (len(digits) > 1 and digits.startswith("0")):
        return " ".join(_DIGIT_WORDS[int(d)] for d in digits)
    return number_to_words(int(digits))


def _currency(m: re.Match[str]) -> str:
    one, many, sub1, subn = _CURRENCY[m.group(1)]
    whole = int(m.group(2).replace(",", ""))
    out = f"{number_to_words(whole)} {one if whole == 1 else many}"
    if m.group(3):
        cents = int(m.group(3).ljust(2, "0"))
        if cents:
            out += f" and {number_to_words(cents)} {sub1 if cents == 1 else subn}"
    return out


def _date(year: int, month: int, day: int) -> str | None:
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return f"{_MONTHS[month - 1]} {ordinal_words(day)}, {_year_words(year)}"


def normalize_english(text: str) -> str:
    """Spell out numbers, currency, dates, percentages and common abbreviations."""
    text = _ABBR_RE.sub(lambda m: _ABBREVIATIONS[m.group(1)], text)
    text = _ISO_DATE_RE.sub(
        lambda m: _date(int(m.group(1)), int(m.group(2)), int(m.group(3))) or m.group(0), text
    )
    text = _US_DATE_RE.sub(
        lambda m: _date(int(m.group(3)), int(m.group(1)), int(m.group(2))) or m.group(0), text
    )
    text = _CURRENCY_RE.sub(_currency, text)
    text = _PERCENT_RE.sub(lambda m: f"{m.group(1)} percent", text)
    text = _ORDINAL_RE.sub(lambda m: ordinal_words(int(m.group(1))), text)
    text = _DECIMAL_RE.sub(
        lambda m: f"{_int_words(m.group(1))} point {' '.join(_DIGIT_WORDS[int(d)] for d in m.group(2))}", text
    )
    text = _NUMBER_RE.sub(lambda m: f" {_int_words(m.group(0))} ", text)
    for sym, word in _EN_SYMBOLS.items():
        text = text.replace(sym, word)
    return re.sub(r"[ \t]{2,}", " ", text)


_ZH_DIGITS = "零一二三四五六七八九"
_ZH_UNITS = ("", "十", "百", "千")
_ZH_BIG = ("", "万", "亿", "万亿")


def chinese_number(n: int) -> str:
    """Chinese reading of a non-negative integer (digit by digit beyond 10^16)."""
    if n == 0:
        return "零"
    if n >= 10**16:
        return "".join(_ZH_DIGITS[int(d)] for d in str(n))
    groups = []
    while n:
        n, g = divmod(n, 10000)
        groups.append(g)
    out = ""
    zero_pending = False
    for gi in range(len(groups) - 1, -1, -1):
        g = groups[gi]
        if g == 0:
            zero_pending = True
            continue
        if out and (zero_pending or g < 1000):
            out += "零"
        zero_pending = False
        s = ""
        digits = f"{g:04d}"
        started = False
        zero = False
        for k, d in enumerate(digits):
            d_i = int(d)
            unit = _ZH_UNITS[3 - k]
            if d_i == 0:
                if started:
                    zero = True
                continue
            if zero:
                s += "零"
                zero = False
            s += _ZH_DIGITS[d_i] + unit
            started = True
        out += s + _ZH_BIG[gi]
    if out.startswith("一十"):
        out = out[1:]
    return out


_ZH_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s?[%％]")
_ZH_YEAR_RE = re.compile(r"(\d{2,4})年")
_ZH_DECIMAL_RE = re.compile(r"(\d+)\.(\d+)")
_ZH_INT_RE = re.compile(r"\d+")
_ZH_SYMBOLS = {
    "+": "加",
    "=": "等于",
    "¥": "元",
    "￥": "元",
    "$": "美元",
    "&": "和",
    "~": "到",
    "℃": "摄氏度",
    "×": "乘",
    "÷": "除以",
}


def _zh_int(digits: str) -> str:
    if len(digits) > 16 or (len(digits) > 1 and digits.startswith("0")):
        return "".join(_ZH_DIGITS[int(d)] for d in digits)
    return chinese_number(int(digits))


def _zh_decimal(m: re.Match[str]) -> str:
    return _zh_int(m.group(1)) + "点" + "".join(_ZH_DIGITS[int(d)] for d in m.group(2))


def normalize_chinese(text: str) -> str:
    """Digits and common symbols to Chinese words (年 years digit by digit)."""
    text = _ZH_PERCENT_RE.sub(lambda m: "百分之" + _ZH_DECIMAL_RE.sub(_zh_decimal, m.group(1)), text)
    text = _ZH_PERCENT_RE.sub(lambda m: m.group(0), text)
    text = _ZH_YEAR_RE.sub(lambda m: "".join(_ZH_DIGITS[int(d)] for d in m.group(1)) + "年", text)
    text = _ZH_DECIMAL_RE.sub(_zh_decimal, text)
    text = re.sub(r"百分之(\d+)", lambda m: "百分之" + _zh_int(m.group(1)), text)
    text = _ZH_INT_RE.sub(lambda m: _zh_int(m.group(0)), text)
    for sym, word in _ZH_SYMBOLS.items():
        text = text.replace(sym, word)
    return text


def normalize(text: str, language: str = "en") -> str:
    """Language-appropriate normalisation of a plain-text segment."""
    if is_chinese_language(language):
        return normalize_chinese(text)
    if language.lower().startswith("en"):
        return normalize_english(text)
    return text


def escape_markup(text: str) -> str:
    """Neutralise engine markup typed by a user so it is read, never obeyed.

    Square brackets would open Piper/eSpeak raw-phoneme blocks, angle brackets
    SSML; they become plain parentheses and spaces.
    """
    return text.translate(_ESCAPE)


_ESCAPE = str.maketrans({"[": "(", "]": ")", "<": " ", ">": " ", "\0": " "})

# --------------------------------------------------------------------------- sentences

_SENT_EN = re.compile(r"[.!?]+[\"')\]]*(?=\s)|\n\s*\n|[。！？；…]+|\n")
_SENT_ZH = re.compile(r"[。！？；…!?;]+[”’」』）)]*|\n+|\.(?=\s)")
_CLAUSE = re.compile(r"[,，、:：;；]\s*")
_SPACE = re.compile(r"\s+")


def _safe_cut(piece: str, limit: int) -> int:
    """A cut position <= limit that does not fall inside a bracket run."""
    cut = limit
    open_pos = piece.rfind("[", 0, cut)
    close_pos = piece.rfind("]", 0, cut)
    if open_pos > close_pos:  # inside [...]
        # go back to the start of the whole run [a][b][c]
        start = open_pos
        while start > 0 and piece[start - 1] == "]":
            prev = piece.rfind("[", 0, start - 1)
            if prev < 0:
                break
            start = prev
        if start > 0:
            cut = start
        else:
            end = piece.find("]", limit)
            cut = end + 1 if end >= 0 else limit
    return cut


def _split_long(piece: str, max_chars: int) -> Iterator[str]:
    """Split an over-long sentence at clause marks, then spaces, then anywhere."""
    while len(piece) > max_chars:
        window = piece[: max_chars + 1]
        cut = -1
        for pattern in (_CLAUSE, _SPACE):
            last = None
            for m in pattern.finditer(window):
                if m.end() > 0 and m.end() <= max_chars:
                    last = m
            if last is not None and last.end() > max_chars // 4:
                cut = last.end()
                break
        if cut <= 0:
            cut = _safe_cut(piece, max_chars)
        head, piece = piece[:cut], piece[cut:]
        if head.strip():
            yield head.strip()
    if piece.strip():
        yield piece.strip()


def split_sentences(text: str, language: str | None = "en", max_chars: int = 400) -> Iterator[str]:
    """Yield sentences (at most ``max_chars`` each) lazily, in order.

    English splits after ``.!?`` followed by space and at blank lines; Chinese
    after ``。！？；…``. A sentence longer than ``max_chars`` is cut at clause
    punctuation, then whitespace, then anywhere outside an annotation.
    """
    if max_chars < 8:
        raise ValueError("max_chars must be at least 8")
    pattern = _SENT_ZH if is_chinese_language(language) else _SENT_EN
    pos = 0
    for m in pattern.finditer(text):
        piece = text[pos : m.end()]
        pos = m.end()
        if any(_is_speakable(c) for c in piece) or "[" in piece:
            yield from _split_long(piece, max_chars)
    rest = text[pos:]
    if rest.strip() and (any(_is_speakable(c) for c in rest) or "[" in rest):
        yield from _split_long(rest, max_chars)


__all__ = [
    "Segment",
    "billable_characters",
    "detect_language",
    "escape_markup",
    "is_chinese_language",
    "iter_segments",
    "normalize",
    "normalize_chinese",
    "normalize_english",
    "number_to_words",
    "parse_annotations",
    "split_sentences",
    "validate_text",
]
