"""synth.lexicon: pronunciation dictionary rules applied to the text, and what they do to real audio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from synth.lexicon import Lexicon, Rule, RuleError, annotation, apply_lexicons, check_rule, ipa_to_arpabet

MINUTE = Rule("minute", phonemes="M AY0 N UW1 T", alphabet="arpabet")
NASA = Rule("NASA", alias="nasa agency", case_sensitive=True)
BEIJING = Rule("北京", phonemes="bei3 jing1", alphabet="pinyin")


def lex(*rules: Rule, name: str = "d", version: int = 1) -> Lexicon:
    return Lexicon(f"id-{name}", version, name, rules)


def test_it_rewrites_whole_words_only_and_leaves_annotations_and_markup_as_typed() -> None:
    text = "A minute, minutes, NASA and nasa, [[minute]] [M][AY1] minute."
    out = apply_lexicons(text, [lex(MINUTE, NASA)], english=True, chinese=False)
    assert out.text == (
        "A [M][AY0][N][UW1][T], minutes, nasa agency and nasa, [[minute]] [M][AY1] [M][AY0][N][UW1][T]."
    )
    assert out.dictionaries == [
        {"id": "id-d", "version": 1, "name": "d", "rules_applied": 2, "replacements": 3}
    ]
    assert out.applied == ["dictionary d v1: 2 rules, 3 words"] and out.not_applied == []


def test_it_maps_every_character_back_to_the_submitted_text() -> None:
    text = "Say minute to NASA."
    out = apply_lexicons(text, [lex(MINUTE, NASA)], english=True, chinese=False)
    spans = out.source_spans()
    assert len(spans) == len(out.text)
    assert {text[a:b] for (a, b), c in zip(spans, out.text, strict=True) if c in "[]MAYNUWT01"} >= {"minute"}
    assert text[slice(*spans[out.text.index("agency")])] == "NASA"
    assert text[slice(*spans[-1])] == "." and out.to_source(len(out.text) - 1) == len(text) - 1


def test_the_first_dictionary_naming_a_word_wins() -> None:
    first = lex(Rule("minute", alias="moment"), name="a")
    second = lex(Rule("minute", alias="instant"), Rule("hour", alias="sixty minutes"), name="b")
    out = apply_lexicons("A minute, an hour.", [first, second], english=True, chinese=False)
    assert out.text == "A moment, an sixty minutes."
    assert [d["rules_applied"] for d in out.dictionaries] == [1, 1]


def test_phonemes_the_voice_cannot_speak_are_reported_not_applied() -> None:
    out = apply_lexicons("北京 and a minute", [lex(BEIJING, MINUTE)], english=True, chinese=False)
    assert out.text.startswith("北京 and a [M]")
    assert out.not_applied == [
        "dictionary d v1 rule '北京' -> /bei3 jing1/ (pinyin): pinyin needs a Chinese voice"
    ]
    zh = apply_lexicons("我在北京", [lex(BEIJING, MINUTE)], english=False, chinese=True)
    assert zh.text == "我在[bei3][jing1]" and zh.not_applied == []


def test_ipa_becomes_arpabet_and_what_has_no_equivalent_is_refused() -> None:
    assert ipa_to_arpabet("təˈmɑːtoʊ") == ["T", "AH0", "M", "AA1", "T", "OW"]
    assert annotation(Rule("x", phonemes="/ˈwɪndoʊ/", alphabet="ipa")) == "[W][IH1][N][D][OW]"
    for bad in (
        Rule("x", phonemes="ʘ", alphabet="ipa"),
        Rule("x", phonemes="QQ", alphabet="arpabet"),
        Rule("x", phonemes="hello", alphabet="pinyin"),
        Rule("x", alias="a [b]"),
        Rule(" x", alias="y"),
        Rule("x", alias="y", phonemes="Y", alphabet="arpabet"),
    ):
        with pytest.raises(RuleError):
            check_rule(bad)


# --------------------------------------------------------------------- on real audio (eSpeak)

_RENDER = """
import json, sys
from synth.lexicon import Lexicon, Rule
from synth.request import SynthesisRequest
from synth.synthesizer import Synthesizer
rules = tuple(Rule(**r) for r in json.loads(sys.argv[2]))
r = Synthesizer(engines=["espeak"]).synthesize(
    SynthesisRequest(text=sys.argv[3], voice="espeak-en-us", format="wav", sample_rate=16000,
                     dictionaries=(Lexicon("d", 1, "d", rules),) if rules else ()),
    sys.argv[1],
)
print(json.dumps(r.timestamps))
"""


def _render(
    tmp: Path, name: str, text: str, rules: list[dict[str, Any]]
) -> tuple[np.ndarray, dict[str, Any]]:
    """In a process of its own: eSpeak carries state (its pitch flutter) from one utterance to the next."""
    path = tmp / f"{name}.wav"
    out = subprocess.run(
        [sys.executable, "-c", _RENDER, str(path), json.dumps(rules), text],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    audio, rate = soundfile.read(path, dtype="float32")
    assert rate == 16000
    return audio, json.loads(out.stdout.strip().splitlines()[-1])


def _span(stamps: dict[str, Any], word: str) -> tuple[int, int]:
    w = next(w for w in stamps["words"] if w["text"] == word)
    return int(w["start"] * 16000), int(w["end"] * 16000)


def _spectrum_db(x: np.ndarray) -> np.ndarray:
    frames = np.lib.stride_tricks.sliding_window_view(x, 512)[::256] * np.hanning(512)
    return np.asarray(20 * np.log10(np.abs(np.fft.rfft(frames, axis=1)) + 1e-4))


def _envelope(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.sqrt(np.convolve(x**2, np.ones(160) / 160, "valid")))


def _close(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(mean spectral difference in dB, envelope correlation) of two stretches, cut to one length."""
    n = min(len(a), len(b))
    db = float(np.abs(_spectrum_db(a[:n]) - _spectrum_db(b[:n])).mean())
    return db, float(np.corrcoef(_envelope(a[:n]), _envelope(b[:n]))[0, 1])


TEXT = "Good morning, tomato, see you soon."


def test_a_rule_changes_the_audio_of_its_word_only(tmp_path: Path) -> None:
    plain, plain_stamps = _render(tmp_path, "plain", TEXT, [])
    ruled, ruled_stamps = _render(tmp_path, "ruled", TEXT, [{"grapheme": "tomato", "alias": "banana"}])
    start, end = _span(plain_stamps, "tomato")
    start_r, end_r = _span(ruled_stamps, "tomato")  # the word as submitted, spoken as the alias
    assert start == start_r
    assert next(w for w in ruled_stamps["words"] if w["text"] == "tomato")["spoken"] == "banana"
    # Before the word: the same samples.
    assert np.array_equal(plain[:start], ruled[:start])
    # The word: other sounds.
    db, corr = _close(plain[start:end], ruled[start:end_r])
    assert db > 10 and corr < 0.5, (db, corr)
    # After it: the same speech; only eSpeak's pitch flutter, which runs on through the utterance, differs.
    after, after_r = plain[end:], ruled[end_r:]
    assert abs(len(after) - len(after_r)) < 0.01 * len(after)
    db, corr = _close(after, after_r)
    assert db < 5 and corr > 0.99, (db, corr)


def test_pocketsphinx_hears_the_alias(tmp_path: Path) -> None:
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=16000, logfn="/dev/null")
    # A word loop, so a word it cannot place does not sink the rest.
    words = "i | like | the | tomato | window | banana | yellow | music | hello | computer"
    decoder.add_jsgf_string("g", f"#JSGF V1.0; grammar g; public <s> = <w>+ ; <w> = {words} ;")
    decoder.activate_search("g")

    def heard(audio: np.ndarray) -> list[str]:
        pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        return decoder.hyp().hypstr.split() if decoder.hyp() else []

    text = "I like the tomato."
    plain = heard(_render(tmp_path, "p", text, [])[0])
    alias = heard(_render(tmp_path, "a", text, [{"grapheme": "tomato", "alias": "window"}])[0])
    ipa = heard(
        _render(tmp_path, "i", text, [{"grapheme": "Tomato", "phonemes": "ˈwɪndoʊ", "alphabet": "ipa"}])[0]
    )
    assert "window" not in plain
    assert "window" in alias and "window" in ipa, (alias, ipa)
