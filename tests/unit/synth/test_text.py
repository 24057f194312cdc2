"""Text validation, annotations, normalisation and chunking."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from synth.errors import AnnotationError, InvalidText
from synth.normalize import normalize_chinese, normalize_english, split_sentences
from synth.text import billable_characters, parse_annotations, validate_text


@pytest.mark.parametrize(
    "text",
    ["", "   \n\t", "...!!!", "😀🎉", "a\0b", "ab\ud800", "x\x07y", "—…?!"],
)
def test_invalid_text(text: str) -> None:
    with pytest.raises(InvalidText) as info:
        validate_text(text)
    assert info.value.code == "invalid_text"
    assert info.value.message


def test_control_char_position_named() -> None:
    with pytest.raises(InvalidText, match="position 5"):
        validate_text("hello\0world")


def test_valid_text_and_limit() -> None:
    validate_text("Hello there.\n\tTabs and newlines are fine.")
    validate_text("她[h][ào]干净")
    with pytest.raises(InvalidText, match="limit"):
        validate_text("x" * 11, max_chars=10)


def test_pinyin_annotation() -> None:
    segs = parse_annotations("她[h][ào]干净")
    assert [s.kind for s in segs] == ["text", "pinyin", "text"]
    assert segs[1].tokens == ("hao4",)
    assert parse_annotations("[h][ao4]")[0].tokens == ("hao4",)
    assert parse_annotations("[hǎo]")[0].tokens == ("hao3",)


def test_arpabet_annotation() -> None:
    segs = parse_annotations("a [M][AY0][N][UW1][T] detail")
    assert segs[1].kind == "arpabet"
    assert segs[1].tokens == ("M", "AY0", "N", "UW1", "T")


@pytest.mark.parametrize("text", ["[1]", "see note [注]", "[[hello]]", "[hello]", "[h]"])
def test_non_annotations_are_text(text: str) -> None:
    assert all(s.kind == "text" for s in parse_annotations(text))
    assert "".join(s.text for s in parse_annotations(text)) == text


@pytest.mark.parametrize(
    ("text", "position"),
    [("abc [h", 4), ("ab]", 2), ("[a[b]]", 2), ("x [h][ao4", 5)],
)
def test_malformed_annotation_names_position(text: str, position: int) -> None:
    with pytest.raises(AnnotationError) as info:
        validate_text(text)
    assert info.value.code == "invalid_annotation"
    assert info.value.position == position
    assert f"position {position}" in info.value.message


def test_parser_is_linear() -> None:
    for text in ("[" * 100_000, "[a]" * 100_000, "]" * 100_000, "[[" + "a" * 100_000):
        start = time.perf_counter()
        try:
            parse_annotations(text)
        except AnnotationError:
            pass
        assert time.perf_counter() - start < 2.0


def test_billable_characters() -> None:
    assert billable_characters("hello") == 5
    assert billable_characters("她[h][ào]干净") == 6  # 她 h ào 干 净 minus 4 brackets
    assert billable_characters("[M][AY0][N][UW1][T]") == len("MAY0NUW1T")
    assert billable_characters("[1]") == 3
    assert billable_characters("a [b") == 4


def test_normalize_english() -> None:
    out = normalize_english("Dr. Smith paid $3.50 on 2024-01-15 for 1,234 items, 15% off, the 21st time.")
    for word in (
        "Doctor",
        "three dollars and fifty cents",
        "January fifteenth, twenty twenty-four",
        "one thousand two hundred thirty-four",
        "fifteen percent",
        "twenty-first",
    ):
        assert word in out
    assert not any(c.isdigit() for c in out)
    huge = normalize_english("9" * 5000)
    assert huge.count("nine") == 5000


def test_normalize_chinese() -> None:
    assert normalize_chinese("我有3个苹果") == "我有三个苹果"
    assert "二零二四年" in normalize_chinese("2024年")
    assert "百分之五十" in normalize_chinese("涨了50%")
    assert "一万零一" in normalize_chinese("10001人")
    assert "十二点五" in normalize_chinese("12.5")


def test_split_sentences_english_and_chinese() -> None:
    assert list(split_sentences("Hello there. How are you? Fine!", "en", 400)) == [
        "Hello there.",
        "How are you?",
        "Fine!",
    ]
    assert list(split_sentences("你好。今天好！是吗？是的；好…", "zh", 400)) == [
        "你好。",
        "今天好！",
        "是吗？",
        "是的；",
        "好…",
    ]


def test_split_is_lazy_and_bounded() -> None:
    gen = split_sentences("word " * 10_000, "en", 100)
    assert iter(gen) is gen  # a generator, not a list
    chunks = list(gen)
    assert all(len(c) <= 100 for c in chunks)
    assert sum(len(c.split()) for c in chunks) == 10_000
    nospace = list(split_sentences("a" * 50_000, "en", 300))
    assert all(len(c) <= 300 for c in nospace) and sum(map(len, nospace)) == 50_000


def test_split_never_cuts_an_annotation() -> None:
    text = "x" * 95 + "[M][AY0][N][UW1][T] end"
    chunks = list(split_sentences(text, "en", 100))
    assert any("[M][AY0][N][UW1][T]" in c for c in chunks)


def test_light_imports() -> None:
    code = (
        "import sys, synth, synth.text, synth.normalize, synth.errors, synth.registry, synth.audio, synth.instructions;"
        "heavy = [m for m in ('onnxruntime', 'torch', 'piper', 'numpy', 'soundfile', 'django', 'celery')"
        " if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
