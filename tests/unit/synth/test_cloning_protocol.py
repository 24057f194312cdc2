"""The engine protocol carries a voice prompt to engines that can clone, and only to them.

No engine of the default install can clone; a tiny fake cloning engine (tests
only) stands in for a GPU model with the capability.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from synth import SynthesisRequest, Synthesizer
from synth.engines.base import VoiceParams, VoicePrompt
from synth.errors import EngineUnavailable
from synth.registry import VoiceInfo

CLONING_VOICE = VoiceInfo("fake-clone", "Fake cloning voice", "en_US", "fake", 16000, {"cloning": True})


class FakeCloningEngine:
    """Speaks a tone at the prompt's length in ms per chunk, and keeps what it was given."""

    name = "fake"
    device = "cpu"

    def __init__(self) -> None:
        self.seen: list[VoiceParams] = []

    def load(self, device: str = "cpu", voice_ids: list[str] | None = None) -> None:
        pass

    def voices(self) -> list[VoiceInfo]:
        return [CLONING_VOICE]

    def capabilities(self) -> dict[str, Any]:
        return {"cloning": True}

    def sample_rate(self, voice: str) -> int:
        return 16000

    def notes(self, params: VoiceParams) -> list[str]:
        return []

    def phonemes(self, text: str, params: VoiceParams) -> list[str]:
        return []

    def synthesize(self, chunks: Iterable[str], params: VoiceParams, **kwargs: Any) -> Iterator[np.ndarray]:
        self.seen.append(params)
        assert params.prompt is not None
        prompt, rate = sf.read(params.prompt.audio_path, dtype="float32")
        for _ in chunks:
            yield prompt[: rate // 2]  # "cloned": the prompt's own voice


class FakeCloningSynthesizer(Synthesizer):
    def __init__(self) -> None:
        super().__init__(engines=["espeak"])
        self.fake = FakeCloningEngine()

    def voice(self, voice_id: str) -> VoiceInfo:
        return CLONING_VOICE if voice_id == CLONING_VOICE.id else super().voice(voice_id)

    def engine(self, name: str) -> Any:
        return self.fake if name == "fake" else super().engine(name)


def _prompt(tmp_path: Path) -> VoicePrompt:
    path = tmp_path / "prompt.wav"
    sf.write(path, (0.3 * np.sin(np.arange(48000) / 5)).astype(np.float32), 16000)
    return VoicePrompt(str(path), 16000, "the words of the prompt", (0.1, 0.2, 0.3))


def test_a_cloning_engine_receives_the_prompt_audio_transcript_and_embedding(tmp_path: Path) -> None:
    synth = FakeCloningSynthesizer()
    prompt = _prompt(tmp_path)
    result = synth.synthesize(
        SynthesisRequest(text="Hello there. Bye.", voice=CLONING_VOICE.id, prompt=prompt),
        str(tmp_path / "o.wav"),
    )
    assert result.duration_seconds > 0.9
    (params,) = synth.fake.seen
    assert params.prompt == prompt
    assert params.prompt.transcript == "the words of the prompt" and params.prompt.embedding == (
        0.1,
        0.2,
        0.3,
    )


def test_an_engine_without_the_capability_refuses_a_prompt_as_cloning_unavailable(tmp_path: Path) -> None:
    synth = FakeCloningSynthesizer()
    with pytest.raises(EngineUnavailable) as info:
        synth.synthesize(
            SynthesisRequest(text="Hello.", voice="espeak-en-us", prompt=_prompt(tmp_path)),
            str(tmp_path / "o.wav"),
        )
    assert info.value.code == "cloning_unavailable"
    assert not (tmp_path / "o.wav").exists()


def test_no_voice_of_the_default_engines_can_clone() -> None:
    """Piper and eSpeak speak their own voices; cloning needs a model that clones (voxcpm)."""
    from synth.registry import list_voices

    assert not any(v.capabilities.get("cloning") for v in list_voices(engines=["piper", "espeak"]))
    assert all(v.capabilities.get("cloning") for v in list_voices(engines=["voxcpm"]))
