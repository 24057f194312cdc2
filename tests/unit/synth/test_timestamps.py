"""Word and sentence timestamps (issue 33): offsets into the submitted text, times on real audio (Piper, eSpeak).

The audio checks are against an energy detector (RMS in 10 ms frames): words spoken with pauses
(commas) must start and end within 80 ms of the silences found between them, never overlap, and
every loud frame must lie within a word.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from synth import SynthesisRequest, Synthesizer
from synth.engines.base import VoiceParams
from synth.normalize import normalize, normalize_mapped
from synth.stream import StreamReader, StreamWriter
from synth.timestamps import SpokenWord, align, place, words_of

TOLERANCE = 0.080  # seconds: the bound between a word's edge and the silence the detector finds
FRAME = 0.010


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0, rate


def loud_frames(audio: np.ndarray, rate: int) -> np.ndarray:
    """Per 10 ms frame: whether its RMS energy is above the silence threshold (-35 dB of the loudest)."""
    n = int(rate * FRAME)
    frames = audio[: len(audio) // n * n].reshape(-1, n)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return np.asarray(rms > rms.max() * 10 ** (-35 / 20))


def silences(loud: np.ndarray, min_seconds: float = 0.08) -> list[tuple[float, float]]:
    """(start, end) seconds of the quiet runs of at least ``min_seconds`` between loud frames."""
    out = []
    i = 0
    first, last = int(np.argmax(loud)), len(loud) - int(np.argmax(loud[::-1]))
    i = first
    while i < last:
        if loud[i]:
            i += 1
            continue
        j = i
        while j < last and not loud[j]:
            j += 1
        if (j - i) * FRAME >= min_seconds:
            out.append((i * FRAME, j * FRAME))
        i = j
    return out


def test_it_maps_normalised_words_back_to_the_characters_submitted() -> None:
    text = "Dr. Smith paid $3.50 for 42 items."
    mapped = normalize_mapped(text, "en")
    assert mapped.text == normalize(text, "en")
    words = {w.text: text[w.char_start : w.char_end] for w in words_of(mapped)}
    assert words["Doctor"] == "Dr."
    assert words["forty"] == words["two"] == "42"
    assert words["dollars"] == words["cents"] == "$3.50"
    assert words["items"] == "items"


def test_it_aligns_words_espeak_ran_together() -> None:
    # "of the" spoken as one phoneme word (ʌvðə): both text words share it, in order.
    groups = align([4, 2, 2, 7], [4, 4, 7])
    assert groups == [(0, 1, 0, 1), (1, 3, 1, 2), (3, 4, 2, 3)]
    spoken = [[(0.0, 0.1), (0.1, 0.2)], [(0.3, 0.35), (0.35, 0.4), (0.4, 0.45), (0.45, 0.5)]]
    timed = place([SpokenWord("a", 0, 1, 2), SpokenWord("of", 2, 4, 2), SpokenWord("the", 5, 8, 2)], spoken)
    assert [(w["text"], w["start"], w["end"]) for w in timed] == [
        ("a", 0.0, 0.2),
        ("of", 0.3, 0.4),
        ("the", 0.4, 0.5),
    ]


@pytest.fixture(scope="module")
def torch_synthesizer() -> Synthesizer:
    synth = Synthesizer(threads=1, engines=["piper"], piper_runtime="torch")
    synth.load(["en_US-joe-medium"])
    return synth


@pytest.mark.parametrize(
    ("voice", "runtime"),
    [("en_US-joe-medium", "onnxruntime"), ("en_US-joe-medium", "torch"), ("espeak-en-us", "")],
)
def test_it_times_words_at_the_silences_between_them(
    synthesizer: Synthesizer, tmp_path: Path, voice: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    text = "Apple, banana, cherry, orange. Lemon, melon, 42."
    out = tmp_path / "words.wav"
    synth = request.getfixturevalue("torch_synthesizer") if runtime == "torch" else synthesizer
    result = synth.synthesize(SynthesisRequest(text=text, voice=voice, format="wav"), str(out))
    assert result.timestamps is not None
    words, sentences = result.timestamps["words"], result.timestamps["sentences"]
    assert [w["text"] for w in words[:6]] == ["Apple", "banana", "cherry", "orange", "Lemon", "melon"]
    assert {w["text"] for w in words[6:]} == {"42"}  # Piper: "forty", "two"; eSpeak: "forty-two"
    assert "".join(w["spoken"] for w in words[6:]).replace("-", "") == "fortytwo"
    for w in words:
        assert text[w["char_start"] : w["char_end"]] == w["text"]
    assert [s["text"] for s in sentences] == ["Apple, banana, cherry, orange.", "Lemon, melon, 42."]
    audio, rate = _read_wav(out)
    duration = len(audio) / rate
    assert sentences[-1]["end"] == pytest.approx(duration, abs=0.02)
    # In order, inside the audio, never overlapping.
    assert 0 <= words[0]["start"]
    assert words[-1]["end"] <= duration + 1e-3
    for a, b in zip(words, words[1:], strict=False):
        assert a["start"] < a["end"] <= b["start"] + 1e-6
    loud = loud_frames(audio, rate)
    # Every loud frame is inside a word (give or take the tolerance).
    for k in np.flatnonzero(loud):
        t = (k + 0.5) * FRAME
        assert any(w["start"] - TOLERANCE <= t <= w["end"] + TOLERANCE for w in words), t
    # Between words with a comma (or a sentence end) the detector finds a silence, and the words'
    # edges are within 80 ms of it. "forty two" has no pause between its words.
    quiet = silences(loud)
    for a, b in zip(words[:6], words[1:7], strict=True):
        gap = next(
            (s for s in quiet if s[0] - TOLERANCE <= a["end"] and b["start"] <= s[1] + TOLERANCE), None
        )
        assert gap is not None, (a, b, quiet)
        assert abs(a["end"] - gap[0]) <= TOLERANCE, (a, gap)
        assert abs(b["start"] - gap[1]) <= TOLERANCE, (b, gap)


def test_it_keeps_an_annotation_as_one_word_and_survives_a_pitch_shift(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    text = "Say [M][AY0][N][UW1][T], please."
    result = synthesizer.synthesize(
        SynthesisRequest(text=text, format="wav", pitch=3), str(tmp_path / "a.wav")
    )
    assert result.timestamps is not None
    words = result.timestamps["words"]
    assert [w["text"] for w in words] == ["Say", "[M][AY0][N][UW1][T]", "please"]
    assert words[-1]["end"] <= result.duration_seconds + 1e-3


def test_it_writes_a_timestamps_record_per_sentence_to_the_stream(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    stream_file = tmp_path / "s.part"
    writer = StreamWriter(str(stream_file))
    synthesizer.synthesize(
        SynthesisRequest(text="One sentence. Another one.", format="pcm"),
        str(tmp_path / "o.pcm"),
        stream=writer,
    )
    with open(stream_file, "rb") as fh:
        reader = StreamReader(fh)
        reader.read()
    assert reader.ended
    assert [e["sentence"]["text"] for _, e in reader.timestamps] == ["One sentence.", "Another one."]
    assert [w["text"] for w in reader.timestamps[1][1]["words"]] == ["Another", "one"]
    assert 0 < reader.timestamps[0][0] < reader.timestamps[1][0] == reader.audio_bytes  # after their audio


def test_it_maps_espeak_words_of_annotations_and_chinese(synthesizer: Synthesizer, tmp_path: Path) -> None:
    text = "Say [M][AY0][N][UW1][T], please."
    result = synthesizer.synthesize(
        SynthesisRequest(text=text, voice="espeak-en-us", format="wav"), str(tmp_path / "e.wav")
    )
    assert result.timestamps is not None
    assert [w["text"] for w in result.timestamps["words"]] == ["Say", "[M][AY0][N][UW1][T]", "please"]
    result = synthesizer.synthesize(
        SynthesisRequest(text="你好，世界。", voice="espeak-cmn", format="wav"), str(tmp_path / "z.wav")
    )
    assert result.timestamps is not None
    assert "".join(w["text"] for w in result.timestamps["words"]) == "你好世界"


def test_it_renders_the_same_string_as_before(synthesizer: Synthesizer) -> None:
    engine = synthesizer.engine("piper")
    params = VoiceParams(voice="en_US-joe-medium")
    text, words = engine.render_words("It's 5% off <b>now</b> [x].", params)  # type: ignore[attr-defined]
    assert text == engine.render("It's 5% off <b>now</b> [x].", params)  # type: ignore[attr-defined]
    assert [w.text for w in words] == ["It's", "five", "percent", "off", "b", "now", "b", "x"]


def test_a_sentence_from_the_cache_keeps_its_words_in_another_jobs_text(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    from synth.cache import MemoryStore

    store = MemoryStore()
    first = synthesizer.synthesize(
        SynthesisRequest(text="Cached words here.", format="wav"), str(tmp_path / "1.wav"), cache=store
    )
    # The same sentence second in another text: a hit, its words shifted to where it stands now.
    text = "Something new first. Cached words here."
    second = synthesizer.synthesize(
        SynthesisRequest(text=text, format="wav"), str(tmp_path / "2.wav"), cache=store
    )
    assert second.cached_sentences == 1
    assert first.timestamps is not None and second.timestamps is not None
    hit = [w for w in second.timestamps["words"] if w["char_start"] >= text.index("Cached")]
    assert [w["text"] for w in hit] == ["Cached", "words", "here"]
    start = second.timestamps["sentences"][1]["start"]
    for a, b in zip(first.timestamps["words"], hit, strict=True):
        assert b["char_start"] == a["char_start"] + text.index("Cached")
        assert b["start"] == pytest.approx(a["start"] + start, abs=1e-3)


def test_it_keeps_one_patched_copy_per_voice_file_and_replaces_a_damaged_one(tmp_path: Path) -> None:
    import os
    import shutil

    from synth.engines.piper import PiperEngine, aligned_model
    from synth.registry import get_voice

    source = get_voice("en_US-joe-medium").model_path
    assert source is not None
    model = tmp_path / "voice.onnx"
    shutil.copy(source, model)
    cache = str(tmp_path / "cache")
    first = aligned_model(str(model), cache)
    assert isinstance(first, str) and os.path.exists(first) and aligned_model(str(model), cache) == first
    os.utime(model, ns=(os.stat(model).st_atime_ns, os.stat(model).st_mtime_ns + 10**9))  # a new version
    second = aligned_model(str(model), cache)
    assert isinstance(second, str) and second != first and not os.path.exists(first)
    with open(second, "wb") as fh:
        fh.write(b"not a model")
    session = PiperEngine(cache_dir=cache)._session(str(model))
    assert [o.name for o in session.get_outputs()][1:] != []  # the durations output is there again
    assert os.path.getsize(second) > 1_000_000
