"""Encoders, resampling, two-pass loudness and guarded decoding (real files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from synth import SynthesisRequest, Synthesizer
from synth.audio import (
    CONTENT_TYPES,
    FORMATS,
    Encoder,
    LoudnessMeter,
    StreamResampler,
    content_type,
    decode_upload,
    loudness_of,
    output_rate,
)
from synth.errors import AudioRejected, UnsupportedFormat, UnsupportedSampleRate


def _tone(seconds: float, sr: int, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 440 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.5 * t))).astype(np.float32)


def test_formats_and_content_types() -> None:
    assert FORMATS == ("wav", "flac", "ogg", "mp3", "pcm", "aac", "ulaw", "alaw")
    assert set(CONTENT_TYPES) == set(FORMATS)
    assert content_type("ulaw") == "audio/basic" and content_type("alaw") == "audio/x-alaw-basic"


def test_pcm_content_type_is_raw_pcm_not_big_endian_l16() -> None:
    assert content_type("pcm") == "audio/pcm" and content_type("mp3") == "audio/mpeg"
    with pytest.raises(UnsupportedFormat):
        content_type("opus")


def test_output_rate_rules() -> None:
    assert output_rate("wav", None, 22050) == 22050
    assert output_rate("ogg", None, 22050) == 24000
    assert output_rate("ogg", 16000, 22050) == 16000
    with pytest.raises(UnsupportedSampleRate):
        output_rate("ogg", 22050, 22050)
    with pytest.raises(UnsupportedSampleRate):
        output_rate("wav", 12345, 22050)
    with pytest.raises(UnsupportedFormat):
        output_rate("m4a", None, 22050)
    # G.711 is 8 kHz whatever the voice's rate; no other rate is offered.
    assert output_rate("ulaw", None, 22050) == 8000 and output_rate("alaw", 8000, 24000) == 8000
    with pytest.raises(UnsupportedSampleRate, match="use one of 8000"):
        output_rate("ulaw", 16000, 22050)


@pytest.mark.parametrize("fmt", ["wav", "flac", "ogg", "mp3", "aac"])
def test_encode_decode_roundtrip(tmp_path: Path, fmt: str) -> None:
    sr = 24000 if fmt == "ogg" else 22050
    path = tmp_path / f"x.{fmt}"
    enc = Encoder(str(path), fmt, sr)
    for _ in range(4):  # streamed chunk by chunk
        enc.write(_tone(0.5, sr))
    enc.close()
    audio, rate = decode_upload(str(path), max_seconds=60, max_bytes=10_000_000)
    assert rate == sr
    assert abs(len(audio) / rate - 2.0) < 0.15
    assert float(np.sqrt(np.mean(audio**2))) > 0.05


def test_pcm_is_raw_s16le(tmp_path: Path) -> None:
    path = tmp_path / "x.pcm"
    enc = Encoder(str(path), "pcm", 16000)
    enc.write(_tone(1.0, 16000))
    enc.close()
    data = np.fromfile(path, dtype="<i2")
    assert data.size == 16000 and np.abs(data).max() > 5000


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    n = min(reference.size, other.size)
    reference, other = reference[:n].astype(np.float64), other[:n].astype(np.float64)
    return float(10 * np.log10(np.sum(reference**2) / np.sum((other - reference) ** 2)))


@pytest.mark.parametrize("fmt", ["ulaw", "alaw"])
def test_g711_files_are_the_source_at_8_khz(tmp_path: Path, fmt: str) -> None:
    """As the synthesizer writes: the voice's audio resampled chunk by chunk, then companded."""
    import soxr

    from synth import g711

    native = 22050
    source = _tone(2.0, native)
    path = tmp_path / f"x.{fmt}"
    tapped: list[bytes] = []
    resampler = StreamResampler(native, 8000)
    enc = Encoder(str(path), fmt, 8000, tap=tapped.append)
    for i in range(0, source.size, 5000):
        enc.write(resampler.process(source[i : i + 5000]))
    enc.write(resampler.process(np.zeros(0, dtype=np.float32), last=True))
    enc.close()
    data = path.read_bytes()
    assert abs(len(data) - 16000) <= 2 and enc.frames == len(data)  # one byte a sample, no header
    # The stream file's samples (the tap) are what was companded: a live encoder makes the same bytes.
    assert g711.encode(b"".join(tapped), fmt) == data
    expected = soxr.resample(source, native, 8000, quality="HQ")
    assert snr_db(expected, g711.decode(data, fmt) / 32767.0) > 30


def test_g711_encoders_refuse_any_rate_but_8_khz(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedSampleRate):
        Encoder(str(tmp_path / "x.ulaw"), "ulaw", 16000)


def test_synthesizer_writes_ulaw_at_8_khz(tmp_path: Path, synthesizer: Synthesizer) -> None:
    out = tmp_path / "hello.ulaw"
    res = synthesizer.synthesize(
        SynthesisRequest(text="Hello there.", voice="espeak-en-us", format="ulaw"), str(out)
    )
    assert res.sample_rate == 8000 and res.bytes == out.stat().st_size
    assert abs(res.duration_seconds - res.bytes / 8000) < 0.01


def test_resample() -> None:
    resampler = StreamResampler(22050, 48000)
    out = np.concatenate(
        [resampler.process(_tone(1.0, 22050)), resampler.process(_tone(0.0, 22050), last=True)]
    )
    assert abs(out.size - 48000) <= 2


def test_streaming_meter_matches_pyloudnorm() -> None:
    sr = 22050
    audio = _tone(5.0, sr)
    meter = LoudnessMeter(sr)
    for i in range(0, audio.size, 3001):
        meter.add(audio[i : i + 3001])
    assert abs(meter.integrated() - loudness_of(audio, sr)) < 0.3


@pytest.mark.parametrize("target", [-23.0, -16.0])
def test_loudness_normalisation(tmp_path: Path, synthesizer: Synthesizer, target: float) -> None:
    out = tmp_path / "loud.wav"
    req = SynthesisRequest(
        text="This is a loudness test. It has a few sentences, so the meter has blocks to gate.",
        voice="espeak-en-us",
        loudness_lufs=target,
    )
    res = synthesizer.synthesize(req, str(out))
    audio, sr = sf.read(out, dtype="float32")
    assert abs(loudness_of(audio, sr) - target) <= 1.0
    assert any("loudness" in a for a in res.applied)


def test_windowed_meter_matches_whole_file_on_speech_of_changing_level(
    tmp_path: Path, synthesizer: Synthesizer
) -> None:
    # A quiet, a loud and a middle part: the windows' gating must agree with a whole-file measurement.
    text = " ".join(f"Part {i} of a story about the weather, told slowly and clearly." for i in range(4))
    res = synthesizer.synthesize(SynthesisRequest(text=text, voice="espeak-en-us"), str(tmp_path / "s.wav"))
    speech, sr = sf.read(res.path, dtype="float32")
    audio = np.concatenate([speech * 0.05, speech, speech * 0.3])
    meter = LoudnessMeter(sr, window_seconds=5.0)
    for i in range(0, audio.size, 7001):
        meter.add(audio[i : i + 7001])
    assert len(meter.windows) > 6  # bounded: the meter keeps one figure per window, not the audio
    assert abs(meter.integrated() - loudness_of(audio, sr)) < 0.5


def test_loudness_target_holds_on_long_piper_text(tmp_path: Path, synthesizer: Synthesizer) -> None:
    text = " ".join(f"Sentence {i} tells a short story about the weather today." for i in range(12))
    req = SynthesisRequest(text=text, loudness_lufs=-16.0, format="flac")
    res = synthesizer.synthesize(req, str(tmp_path / "long.flac"))
    audio, sr = sf.read(res.path, dtype="float32")
    assert res.duration_seconds > 30
    assert abs(loudness_of(audio, sr) - -16.0) <= 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["long.flac"]  # the float32 spool is gone


def test_decode_rejects_oversize(tmp_path: Path) -> None:
    path = tmp_path / "x.wav"
    sf.write(path, _tone(3.0, 16000), 16000)
    with pytest.raises(AudioRejected, match="bytes"):
        decode_upload(str(path), max_seconds=60, max_bytes=1000)
    with pytest.raises(AudioRejected, match="limit"):
        decode_upload(str(path), max_seconds=2, max_bytes=10_000_000)


def test_tiny_file_that_decodes_to_hours_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.flac"
    sr = 8000
    silence = np.zeros(sr * 60, dtype=np.int16)
    with sf.SoundFile(path, "w", sr, 1, format="FLAC", subtype="PCM_16") as fh:
        for _ in range(120):  # two hours of silence
            fh.write(silence)
    assert path.stat().st_size < 2_000_000
    with pytest.raises(AudioRejected) as info:
        decode_upload(str(path), max_seconds=60, max_bytes=5_000_000)
    assert info.value.code == "audio_rejected"


def test_decode_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.wav"
    path.write_bytes(b"not audio at all" * 100)
    with pytest.raises(AudioRejected):
        decode_upload(str(path), max_seconds=60, max_bytes=1_000_000)
