"""Voice prompts: every upload limit with a real file that breaks it, the canonical form, the analysis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from synth.prompt import (
    CANONICAL_RATE,
    PromptLimits,
    PromptRejected,
    PromptStats,
    prepare_prompt,
    sniff_container,
)
from synth.speaker import SpeakerProfile
from tests import prompt_files as pf

LIMITS = PromptLimits(max_bytes=2_000_000)


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pf.flite("slt", tmp_path_factory.mktemp("prompt") / "slt.wav")


def _refusal(src: Path, tmp_path: Path, limits: PromptLimits = LIMITS) -> str:
    dst = tmp_path / "canonical.wav"
    with pytest.raises(PromptRejected) as info:
        prepare_prompt(str(src), str(dst), limits)
    assert not dst.exists(), "nothing half-written on a refusal"
    return info.value.code


def test_a_good_prompt_becomes_canonical_mono_16k_trimmed_and_levelled(
    speech_wav: Path, tmp_path: Path
) -> None:
    audio, rate = sf.read(speech_wav, dtype="float32")
    padded = np.concatenate([np.zeros(rate), audio * 0.1, np.zeros(rate)])  # quiet, 1 s silence each side
    stereo = np.stack([padded, padded], axis=1)
    src = tmp_path / "in.flac"
    sf.write(src, stereo, rate, format="FLAC")
    dst = tmp_path / "out.wav"
    stats = prepare_prompt(str(src), str(dst), LIMITS)
    out, out_rate = sf.read(dst, dtype="float32", always_2d=True)
    assert out_rate == CANONICAL_RATE and out.shape[1] == 1
    assert stats.container == "flac" and stats.duration_seconds == pytest.approx(padded.size / rate, abs=0.01)
    assert stats.trimmed_seconds < stats.duration_seconds - 1.5  # most of the 2 s of silence is gone
    assert out.shape[0] / CANONICAL_RATE == pytest.approx(stats.trimmed_seconds, abs=0.01)
    # Levelled: the quiet input comes out near the canonical speech level, not 20 dB down.
    assert stats.speech_dbfs < -30
    assert 0.2 < float(np.max(np.abs(out))) <= 0.9


def test_it_resamples_a_44k_prompt(speech_wav: Path, tmp_path: Path) -> None:
    import soxr

    audio, rate = sf.read(speech_wav, dtype="float32")
    src = pf.write(tmp_path / "in.wav", soxr.resample(audio, rate, 44100), 44100)
    stats = prepare_prompt(str(src), str(tmp_path / "out.wav"), LIMITS)
    assert stats.source_rate == 44100
    assert sf.info(str(tmp_path / "out.wav")).samplerate == CANONICAL_RATE


def test_it_refuses_a_file_over_the_size_limit(speech_wav: Path, tmp_path: Path) -> None:
    assert _refusal(speech_wav, tmp_path, PromptLimits(max_bytes=10_000)) == "upload_too_large"


def test_it_refuses_a_renamed_text_file_by_its_magic_bytes(tmp_path: Path) -> None:
    assert _refusal(pf.renamed_text_file(tmp_path / "notes.wav"), tmp_path) == "unsupported_media_type"


def test_it_refuses_a_truncated_header(speech_wav: Path, tmp_path: Path) -> None:
    code = _refusal(pf.truncated_header(tmp_path / "cut.wav", speech_wav), tmp_path)
    assert code in ("unsupported_media_type", "invalid_audio")


def test_it_refuses_nan_samples_in_a_float_wav(tmp_path: Path) -> None:
    assert _refusal(pf.nan_float_wav(tmp_path / "nan.wav"), tmp_path) == "invalid_audio"


def test_it_refuses_a_header_claiming_2_to_the_32_frames_before_decoding(
    speech_wav: Path, tmp_path: Path
) -> None:
    bomb = pf.flac_claiming_2_32_frames(tmp_path / "bomb.flac", speech_wav)
    assert bomb.stat().st_size < 200_000
    assert _refusal(bomb, tmp_path) == "audio_too_long"


def test_it_refuses_prompts_shorter_than_3_or_longer_than_15_seconds(tmp_path: Path) -> None:
    assert _refusal(pf.write(tmp_path / "short.wav", pf.tone(2.0)), tmp_path) == "audio_too_short"
    assert _refusal(pf.write(tmp_path / "long.wav", pf.tone(16.0)), tmp_path) == "audio_too_long"


def test_it_refuses_a_sample_rate_below_16k(speech_wav: Path, tmp_path: Path) -> None:
    audio, rate = sf.read(speech_wav, dtype="float32")
    assert _refusal(pf.eight_khz(tmp_path / "8k.wav", audio, rate), tmp_path) == "sample_rate_too_low"


def test_the_child_runs_under_a_memory_limit(speech_wav: Path, tmp_path: Path) -> None:
    # 64 MiB of address space cannot even hold the decoders: the child dies, the caller answers cleanly.
    assert _refusal(speech_wav, tmp_path, PromptLimits(max_bytes=2_000_000, memory_mb=64)) == "invalid_audio"


def test_the_child_is_killed_after_its_time_limit(speech_wav: Path, tmp_path: Path) -> None:
    assert (
        _refusal(speech_wav, tmp_path, PromptLimits(max_bytes=2_000_000, timeout_seconds=0.01))
        == "invalid_audio"
    )


def test_sniffing_knows_the_common_containers() -> None:
    assert sniff_container(b"RIFF\x00\x00\x00\x00WAVEfmt ") == "wav"
    assert sniff_container(b"OggS\x00\x02") == "ogg"
    assert sniff_container(b"\x00\x00\x00\x20ftypM4A ") == "mp4"
    assert sniff_container(b"\xff\xfb\x90\x00") == "mpeg"
    with pytest.raises(PromptRejected):
        sniff_container(b"RIFF\x00\x00\x00\x00AVI LIST")
    with pytest.raises(PromptRejected):
        sniff_container(b"#EXTM3U\nfile:///etc/passwd")


# --------------------------------------------------------------------------- analysis (synth.speaker)


def _analyse(src: Path, tmp_path: Path) -> tuple[PromptStats, SpeakerProfile]:
    from synth import speaker

    dst = tmp_path / "canonical.wav"
    stats = prepare_prompt(str(src), str(dst), LIMITS)
    audio, rate = sf.read(dst, dtype="float32")
    return stats, speaker.profile(audio, rate)


def test_analysis_of_a_good_prompt_gives_an_embedding_and_pitch(speech_wav: Path, tmp_path: Path) -> None:
    from synth import speaker

    stats, prof = _analyse(speech_wav, tmp_path)
    assert isinstance(prof, speaker.SpeakerProfile)
    assert speaker.rejection(stats, prof) is None
    assert len(prof.embedding) == 256 and np.linalg.norm(prof.embedding) == pytest.approx(1.0, abs=0.01)
    assert prof.median_f0 is not None and 140 < prof.median_f0 < 230  # slt is a female voice
    assert (
        prof.f0_low is not None and prof.f0_high is not None and prof.f0_low < prof.median_f0 < prof.f0_high
    )


def test_the_same_speaker_is_closer_than_another(speech_wav: Path, tmp_path: Path) -> None:
    from synth import speaker

    _, slt = _analyse(speech_wav, tmp_path)
    other_text = "The birch canoe slid on the smooth planks, glue the sheet to the dark blue background."
    _, slt2 = _analyse(pf.flite("slt", tmp_path / "slt2.wav", other_text), tmp_path)
    _, awb = _analyse(pf.flite("awb", tmp_path / "awb.wav", other_text), tmp_path)
    assert isinstance(slt, speaker.SpeakerProfile)
    assert (
        speaker.similarity(slt.embedding, slt2.embedding)
        > speaker.similarity(slt.embedding, awb.embedding) + 0.1
    )


@pytest.mark.parametrize(
    ("make", "code"),
    [
        ("silence", "no_speech"),
        ("noise", "no_speech"),
        ("clipped", "clipped_audio"),
        ("very_quiet", "too_quiet"),
    ],
)
def test_analysis_rejects_prompts_without_usable_speech(
    make: str, code: str, speech_wav: Path, tmp_path: Path
) -> None:
    from synth import speaker

    audio, rate = sf.read(speech_wav, dtype="float32")
    builder = getattr(pf, make)
    src = (
        builder(tmp_path / f"{make}.wav")
        if make in ("silence", "noise")
        else builder(tmp_path / "x.wav", audio, rate)
    )
    stats, prof = _analyse(src, tmp_path)
    assert isinstance(prof, speaker.SpeakerProfile)
    found = speaker.rejection(stats, prof)
    assert found is not None and found[0] == code


def test_a_steady_hum_is_not_speech(tmp_path: Path) -> None:
    from synth import speaker

    stats, prof = _analyse(pf.write(tmp_path / "hum.wav", pf.tone(5.0)), tmp_path)
    assert isinstance(prof, speaker.SpeakerProfile)
    found = speaker.rejection(stats, prof)
    assert found is not None and found[0] == "no_speech"


def test_closest_voice_picks_the_nearest_embedding_and_shifts_pitch_towards_the_prompt() -> None:
    from synth.speaker import SpeakerProfile, closest_voice, semitones_between

    prompt = SpeakerProfile([1.0, 0.0, 0.0], 200.0, 180.0, 220.0, 4.0)
    far = SpeakerProfile([0.0, 1.0, 0.0], 100.0, 90.0, 110.0, 4.0)
    near = SpeakerProfile([0.9, 0.1, 0.0], 100.0, 90.0, 110.0, 4.0)
    pick = closest_voice(prompt, {"far": far, "near": near})
    assert pick.voice_id == "near" and pick.pitch_shift == pytest.approx(12.0)
    assert semitones_between(100.0, 150.0) == pytest.approx(7.02, abs=0.01)
    assert semitones_between(100.0, 1000.0) == 12.0  # within the engines' pitch range
    assert semitones_between(None, 150.0) == 0.0
