"""The sentence cache, synth side (synth.cache): entries, keys, and jobs stitched from hits and misses.

Real engines: Piper (onnxruntime, not seeded: a fresh render differs from a
stored one) and eSpeak NG; the store is synth.cache.MemoryStore, which keeps
entries encoded exactly as the webapp's disk store does.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

import synth.cache as cache_module
from synth import SynthesisRequest, Synthesizer
from synth.cache import (
    MemoryStore,
    SentenceEntry,
    decode_entry,
    encode_entry,
    key_basis,
    sentence_key,
)
from synth.engines.base import VoiceParams

SENTENCES = [
    "Your package has been shipped.",
    "It will arrive on Tuesday between nine and noon.",
    "Reply stop to end these messages.",
]
TEXT = " ".join(SENTENCES)


def _render(s: Synthesizer, tmp: Path, name: str, text: str, store: Any, **kw: Any) -> tuple[Any, np.ndarray]:
    kw.setdefault("voice", "en_US-joe-medium")
    result = s.synthesize(SynthesisRequest(text=text, format="wav", **kw), str(tmp / name), cache=store)
    audio, _ = sf.read(result.path, dtype="int16")
    return result, audio


def _layout(
    s: Synthesizer, store: MemoryStore, sentences: list[str], silence: float = 0.2, **kw: Any
) -> np.ndarray:
    """What a job of ``sentences`` must be, sample for sample: each stored entry, the pause between."""
    from synth.audio import pcm16_samples

    basis = _basis(s, **kw)
    gap = np.zeros(int(round(silence * 22050)), np.float32)
    parts: list[np.ndarray] = []
    for i, sentence in enumerate(sentences):
        entry = store.get(sentence_key(basis, sentence))
        assert entry is not None, sentence
        parts += [gap, entry.audio] if i else [entry.audio]
    return pcm16_samples(np.clip(np.concatenate(parts), -1.0, 1.0))


def _basis(s: Synthesizer, voice: str = "en_US-joe-medium", **kw: Any) -> str:
    info = s.voice(voice)
    plan = s.plan(SynthesisRequest(text="x", voice=voice, **kw))
    return key_basis(
        info, plan.params, int(s.engine(info.engine).sample_rate(voice)), info.engine, s.piper_runtime
    )


def test_an_entry_round_trips_bit_for_bit_with_its_sidecar() -> None:
    audio = np.random.default_rng(1).standard_normal(1234).astype(np.float32)
    entry = decode_entry(encode_entry(SentenceEntry(audio, 22050, {"words": [[0, 3, 0.0, 0.2]]})))
    assert entry is not None and entry.sample_rate == 22050 and entry.meta == {"words": [[0, 3, 0.0, 0.2]]}
    assert entry.audio.tobytes() == audio.tobytes()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty", "header"])
def test_a_damaged_entry_decodes_to_a_miss(damage: str) -> None:
    data = bytearray(encode_entry(SentenceEntry(np.ones(100, np.float32), 16000)))
    if damage == "truncated":
        data = data[:-7]
    elif damage == "flipped":
        data[-5] ^= 0x40
    elif damage == "garbage":
        data = bytearray(b"\x00" * 64)
    elif damage == "empty":
        data = bytearray()
    else:
        data = data[:10] + b"{not json" + data[20:]
    assert decode_entry(bytes(data)) is None


def test_the_key_changes_with_text_controls_voice_and_rate(synthesizer: Synthesizer) -> None:
    voice = synthesizer.voice("en_US-joe-medium")
    base = key_basis(voice, VoiceParams(voice=voice.id), 22050, "piper", "onnxruntime")
    assert base == key_basis(voice, VoiceParams(voice=voice.id), 22050, "piper", "onnxruntime")
    others = [
        key_basis(voice, VoiceParams(voice=voice.id, speed=1.1), 22050, "piper", "onnxruntime"),
        key_basis(voice, VoiceParams(voice=voice.id, pitch=1.0), 22050, "piper", "onnxruntime"),
        key_basis(voice, VoiceParams(voice=voice.id, noise_scale=0.5), 22050, "piper", "onnxruntime"),
        key_basis(voice, VoiceParams(voice=voice.id), 16000, "piper", "onnxruntime"),
        key_basis(voice, VoiceParams(voice=voice.id), 22050, "piper", "torch"),
        key_basis(synthesizer.voice("espeak-en-us"), VoiceParams(voice="espeak-en-us"), 22050, "espeak", ""),
    ]
    assert len({base, *others}) == len(others) + 1
    assert sentence_key(base, "Hello.") != sentence_key(base, "Hello!")


def test_a_job_served_wholly_from_the_cache_is_the_job_that_filled_it(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    store = MemoryStore()
    first, first_audio = _render(synthesizer, tmp_path, "a.wav", TEXT, store)
    assert (first.cached_sentences, len(store.entries)) == (0, 3)
    again, again_audio = _render(synthesizer, tmp_path, "b.wav", TEXT, store)
    assert again.cached_sentences == 3 and again.cached_characters == sum(len(s) for s in SENTENCES)
    assert again.duration_seconds == first.duration_seconds
    assert Path(again.path).read_bytes() == Path(first.path).read_bytes()
    # The cached job is its stored entries, bit for bit, with the pause between them.
    assert again_audio.tobytes() == _layout(synthesizer, store, SENTENCES).tobytes()


def test_a_partial_hit_renders_only_the_changed_sentence_with_the_same_pauses(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    store = MemoryStore()
    _render(synthesizer, tmp_path, "a.wav", TEXT, store)
    changed = [SENTENCES[0], "It will arrive on Friday before noon.", SENTENCES[2]]
    fresh, fresh_audio = _render(
        synthesizer, tmp_path, "b.wav", " ".join(changed), store, sentence_silence=0.3
    )
    assert fresh.cached_sentences == 2
    assert fresh.cached_characters == len(SENTENCES[0]) + len(SENTENCES[2])
    assert len(store.entries) == 4
    # Seamless joins: the job is the stored sentences (two old, one new) and exact pauses, nothing else.
    assert fresh_audio.tobytes() == _layout(synthesizer, store, changed, silence=0.3).tobytes()


def test_espeak_entries_hit_too_and_loudness_runs_after_stitching(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    store = MemoryStore()
    first, _ = _render(synthesizer, tmp_path, "a.wav", TEXT, store, voice="espeak-en-us", loudness_lufs=-20.0)
    again, _ = _render(synthesizer, tmp_path, "b.wav", TEXT, store, voice="espeak-en-us", loudness_lufs=-20.0)
    assert again.cached_sentences == 3
    assert Path(again.path).read_bytes() == Path(first.path).read_bytes()
    # Another target: the same cached sentences, normalised to it as a whole job.
    other, _ = _render(synthesizer, tmp_path, "c.wav", TEXT, store, voice="espeak-en-us", loudness_lufs=-30.0)
    assert other.cached_sentences == 3 and Path(other.path).read_bytes() != Path(first.path).read_bytes()


def test_a_repeat_inside_one_job_is_rendered_and_a_later_job_finds_it(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    store = MemoryStore()
    twice = f"{SENTENCES[0]} {SENTENCES[0]}"
    first, _ = _render(synthesizer, tmp_path, "a.wav", twice, store)
    assert first.cached_sentences == 0 and len(store.entries) == 1
    again, _ = _render(synthesizer, tmp_path, "b.wav", twice, store)
    assert again.cached_sentences == 2


def test_a_corrupt_entry_is_a_miss_and_is_rendered_again(synthesizer: Synthesizer, tmp_path: Path) -> None:
    store = MemoryStore()
    _render(synthesizer, tmp_path, "a.wav", TEXT, store)
    key = sentence_key(_basis(synthesizer), SENTENCES[1])
    store.entries[key] = store.entries[key][:-100]
    again, _ = _render(synthesizer, tmp_path, "b.wav", TEXT, store)
    assert again.cached_sentences == 2
    assert store.get(key) is not None  # stored anew


class FullDisk(MemoryStore):
    def put(self, key: str, entry: SentenceEntry) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_store_that_cannot_write_leaves_the_job_uncached_and_whole(
    synthesizer: Synthesizer, tmp_path: Path
) -> None:
    result, audio = _render(synthesizer, tmp_path, "a.wav", TEXT, FullDisk())
    assert result.cached_sentences == 0 and result.duration_seconds > 2 and audio.any()


def test_progress_follows_each_render_and_the_end_and_cancel_every_sentence(
    synthesizer: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from synth.errors import Cancelled

    store = MemoryStore()
    _render(synthesizer, tmp_path, "a.wav", " ".join(SENTENCES[:2]), store)
    seen: list[tuple[int, int]] = []
    request = SynthesisRequest(text=TEXT, format="wav")
    synthesizer.synthesize(
        request, str(tmp_path / "b.wav"), progress=lambda d, t: seen.append((d, t)), cache=store
    )
    # Two quick hits report nothing (a database write each in the worker), the render and the end do.
    assert seen == [(3, 3)]
    seen.clear()
    # Wholly cached and quick: nothing until its completion; one that took longer reports its end.
    synthesizer.synthesize(
        request, str(tmp_path / "b2.wav"), progress=lambda d, t: seen.append((d, t)), cache=store
    )
    assert seen == []
    monkeypatch.setattr(cache_module, "HIT_PROGRESS_SECONDS", 0.0)
    synthesizer.synthesize(
        request, str(tmp_path / "b3.wav"), progress=lambda d, t: seen.append((d, t)), cache=store
    )
    assert seen[-1] == (3, 3)
    monkeypatch.undo()
    seen.clear()
    _render(synthesizer, tmp_path, "c.wav", "A new one. " + TEXT, MemoryStore())  # (warm)
    synthesizer.synthesize(
        SynthesisRequest(text="A new one. And another. " + SENTENCES[0], format="wav"),
        str(tmp_path / "d.wav"),
        progress=lambda d, t: seen.append((d, t)),
        cache=store,
    )
    assert seen == [(1, 3), (2, 3)]  # the renders; the quick hit that ends the job says nothing
    asked: list[int] = []

    def cancel_at_the_second_check() -> bool:
        asked.append(1)
        return len(asked) >= 2

    with pytest.raises(Cancelled):  # every sentence checks, hits too: wholly cached, stopped at the second
        synthesizer.synthesize(
            request,
            str(tmp_path / "e.wav"),
            should_cancel=cancel_at_the_second_check,
            cache=store,
        )


def _parts_engine(fail_at: int | None = None) -> Any:
    """An engine's render that yields each sentence as Pieces (a remote model's stream): three parts
    of a tone each; ``fail_at``: the sentence whose stream breaks off after its first part."""
    from synth.engines.base import Pieces
    from synth.errors import UpstreamFailed

    def render(chunks: Any, total: int) -> Any:
        for i, chunk in enumerate(chunks):
            tone = (np.sin(np.arange(3 * 2205) * (0.01 + len(chunk) / 1e4)) * 0.3).astype(np.float32)

            def parts(tone: np.ndarray = tone, broken: bool = i == fail_at) -> Any:
                for n, part in enumerate(np.array_split(tone, 3)):
                    if broken and n == 1:
                        raise UpstreamFailed("the upstream went away mid-sentence")
                    yield part

            yield Pieces(parts())

    return render


def test_a_sentence_that_comes_in_parts_is_passed_on_part_by_part_and_stored_once_whole() -> None:
    from synth.cache import CacheStats, cached_sentences
    from synth.engines.base import Pieces

    store, stats = MemoryStore(), CacheStats()
    keys = [f"key-{i}" for i in range(len(SENTENCES))]
    got = []
    for audio in cached_sentences(SENTENCES, keys, store, _parts_engine(), 22050, stats):
        assert isinstance(audio, Pieces)
        parts = list(audio)
        assert len(parts) == 3  # passed on as they came, not joined first
        got.append(np.concatenate(parts))
    for key, audio in zip(keys, got, strict=True):
        entry = store.get(key)
        assert entry is not None and np.array_equal(entry.audio, audio)
    assert (stats.misses, stats.hits) == (3, 0)


def test_a_sentence_whose_parts_broke_off_is_not_stored() -> None:
    from synth.cache import CacheStats, cached_sentences
    from synth.errors import UpstreamFailed

    store = MemoryStore()
    keys = [f"key-{i}" for i in range(len(SENTENCES))]
    with pytest.raises(UpstreamFailed):
        for audio in cached_sentences(SENTENCES, keys, store, _parts_engine(fail_at=1), 22050, CacheStats()):
            list(audio)
    assert store.get(keys[0]) is not None
    assert store.get(keys[1]) is None  # half a sentence is never served as the whole one
