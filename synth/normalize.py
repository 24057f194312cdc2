"""Text as the engines read it (workers only): language, normalisation, sentence splitting.

Numbers, currency, dates and abbreviations are spelled out (English and
Chinese); long text is cut into sentences lazily so memory per step stays
bounded whatever the length. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

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
        if any(is_speakable(c) for c in piece) or "[" in piece:
            yield from _split_long(piece, max_chars)
    rest = text[pos:]
    if rest.strip() and (any(is_speakable(c) for c in rest) or "[" in rest):
        yield from _split_long(rest, max_chars)


__all__ = [
    "chinese_number",
    "detect_language",
    "escape_markup",
    "is_chinese_language",
    "normalize",
    "normalize_chinese",
    "normalize_english",
    "number_to_words",
    "ordinal_words",
    "split_sentences",
]
