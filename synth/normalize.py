"""Text as the engines read it (workers only): language, normalisation, sentence splitting.

Numbers, currency, dates and abbreviations are spelled out (English and
Chinese); long text is cut into sentences lazily so memory per step stays
bounded whatever the length. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from synth.text import is_speakable

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


class Mapped:
    """Text with, for each character, the span ``[start, end)`` of the input it came from.

    Every rewrite of the text goes through :meth:`sub` / :meth:`replace`, which give the
    characters of a replacement the span of everything the match covered: "42" spelled
    "forty-two" maps each of its letters back to the two digits. Word timestamps report
    offsets into the text as submitted through this map (synth.timestamps).
    """

    __slots__ = ("spans", "text")

    def __init__(self, text: str, spans: list[tuple[int, int]]) -> None:
        self.text = text
        self.spans = spans

    @classmethod
    def of(cls, text: str, offset: int = 0) -> Mapped:
        return cls(text, [(offset + i, offset + i + 1) for i in range(len(text))])

    def sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> Mapped:
        """``pattern.sub(repl, text)``, carrying the spans."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        for m in pattern.finditer(self.text):
            start, end = m.span()
            parts.append(self.text[pos:start])
            spans.extend(self.spans[pos:start])
            new = repl(m) if callable(repl) else m.expand(repl)
            parts.append(new)
            if start < end:
                covered = (self.spans[start][0], self.spans[end - 1][1])
            elif self.spans:  # an empty match: the character it sits before (or the last one)
                covered = self.spans[min(start, len(self.spans) - 1)]
            else:
                covered = (0, 0)
            spans.extend([covered] * len(new))
            pos = end
        if not parts:
            return self
        parts.append(self.text[pos:])
        spans.extend(self.spans[pos:])
        return Mapped("".join(parts), spans)

    def replace(self, old: str, new: str) -> Mapped:
        return self.sub(re.compile(re.escape(old)), lambda _m: new) if old in self.text else self

    def translate(self, table: dict[int, str]) -> Mapped:
        """``str.translate`` with one-character replacements (length-preserving, spans kept)."""
        out = self.text.translate(table)
        if len(out) != len(self.text):
            raise ValueError("translate must keep the length")
        return Mapped(out, self.spans)


def _normalize_english(text: Mapped) -> Mapped:
    text = text.sub(_ABBR_RE, lambda m: _ABBREVIATIONS[m.group(1)])
    text = text.sub(
        _ISO_DATE_RE, lambda m: _date(int(m.group(1)), int(m.group(2)), int(m.group(3))) or m.group(0)
    )
    text = text.sub(
        _US_DATE_RE, lambda m: _date(int(m.group(3)), int(m.group(1)), int(m.group(2))) or m.group(0)
    )
    text = text.sub(_CURRENCY_RE, _currency)
    text = text.sub(_PERCENT_RE, lambda m: f"{m.group(1)} percent")
    text = text.sub(_ORDINAL_RE, lambda m: ordinal_words(int(m.group(1))))
    text = text.sub(
        _DECIMAL_RE,
        lambda m: f"{_int_words(m.group(1))} point {' '.join(_DIGIT_WORDS[int(d)] for d in m.group(2))}",
    )
    text = text.sub(_NUMBER_RE, lambda m: f" {_int_words(m.group(0))} ")
    for sym, word in _EN_SYMBOLS.items():
        text = text.replace(sym, word)
    return text.sub(_SPACES, " ")


_SPACES = re.compile(r"[ \t]{2,}")


def normalize_english(text: str) -> str:
    """Spell out numbers, currency, dates, percentages and common abbreviations."""
    return _normalize_english(Mapped.of(text)).text


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


_BAIFENZHI_RE = re.compile(r"百分之(\d+)")


def _normalize_chinese(text: Mapped) -> Mapped:
    text = text.sub(_ZH_PERCENT_RE, lambda m: "百分之" + _ZH_DECIMAL_RE.sub(_zh_decimal, m.group(1)))
    text = text.sub(_ZH_PERCENT_RE, lambda m: m.group(0))
    text = text.sub(_ZH_YEAR_RE, lambda m: "".join(_ZH_DIGITS[int(d)] for d in m.group(1)) + "年")
    text = text.sub(_ZH_DECIMAL_RE, _zh_decimal)
    text = text.sub(_BAIFENZHI_RE, lambda m: "百分之" + _zh_int(m.group(1)))
    text = text.sub(_ZH_INT_RE, lambda m: _zh_int(m.group(0)))
    for sym, word in _ZH_SYMBOLS.items():
        text = text.replace(sym, word)
    return text


def normalize_chinese(text: str) -> str:
    """Digits and common symbols to Chinese words (年 years digit by digit)."""
    return _normalize_chinese(Mapped.of(text)).text


def normalize_mapped(text: str, language: str = "en", offset: int = 0) -> Mapped:
    """:func:`normalize` with each output character's span in ``text`` (shifted by ``offset``)."""
    mapped = Mapped.of(text, offset)
    if is_chinese_language(language):
        return _normalize_chinese(mapped)
    if language.lower().startswith("en"):
        return _normalize_english(mapped)
    return mapped


def normalize(text: str, language: str = "en") -> str:
    """Language-appropriate normalisation of a plain-text segment."""
    return normalize_mapped(text, language).text


def escape_markup(text: str) -> str:
    """Neutralise engine markup typed by a user so it is read, never obeyed.

    Square brackets would open Piper/eSpeak raw-phoneme blocks, angle brackets
    SSML; they become plain parentheses and spaces.
    """
    return text.translate(_ESCAPE)


def escape_markup_mapped(text: Mapped) -> Mapped:
    """:func:`escape_markup`, keeping the spans (it replaces characters one for one)."""
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
        if any(is_speakable(c) for c in piece) or "[" in piece:
            yield from _split_long(piece, max_chars)
    rest = text[pos:]
    if rest.strip() and (any(is_speakable(c) for c in rest) or "[" in rest):
        yield from _split_long(rest, max_chars)


__all__ = [
    "Mapped",
    "chinese_number",
    "detect_language",
    "escape_markup",
    "escape_markup_mapped",
    "is_chinese_language",
    "normalize",
    "normalize_chinese",
    "normalize_english",
    "normalize_mapped",
    "number_to_words",
    "ordinal_words",
    "split_sentences",
]
