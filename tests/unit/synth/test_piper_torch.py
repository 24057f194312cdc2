"""The PyTorch Piper engine against the voice's own ONNX graph, on the CPU (real weights, real audio)."""

from __future__ import annotations

from typing import Any, TypedDict, cast

import numpy as np
import pytest
import torch

from synth import DEFAULT_VOICE, SynthesisRequest, Synthesizer
from synth.engines import vits_torch
from synth.engines.base import VoiceParams
from synth.engines.piper_torch import PiperTorchEngine
from synth.errors import EngineUnavailable, UnknownVoice, UnsupportedControl
from synth.registry import piper_voice_files

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello there!",
    "A third sentence, longer than the second.",
    "Forty-two is read as words.",
    "Is this a question?",
    "Short.",
    "The keeper trimmed the wick.",
    "Eight make one batch.",
]


class _Noise(TypedDict):
    noise_scale: float
    noise_w: float


QUIET: _Noise = {"noise_scale": 0.0, "noise_w": 0.0}


@pytest.fixture(scope="module")
def voice_files() -> tuple[str, str]:
    return piper_voice_files(None)[DEFAULT_VOICE]


@pytest.fixture(scope="module")
def torch_synthesizer() -> Synthesizer:
    synth = Synthesizer(threads=1, engines=["piper"], piper_runtime="torch")  # 1 thread: tests share 2 cores
    synth.load([DEFAULT_VOICE])
    return synth


@pytest.fixture(scope="module")
def engine(torch_synthesizer: Synthesizer) -> PiperTorchEngine:
    eng = torch_synthesizer.engine("piper")
    assert isinstance(eng, PiperTorchEngine)
    return eng


def _ids(engine: PiperTorchEngine, text: str) -> list[int]:
    voice: Any = engine._voice(DEFAULT_VOICE)
    return list(voice.piper.phonemes_to_ids(voice.phonemize(text)[0]))


def test_weight_loading_covers_every_inference_parameter(voice_files: tuple[str, str]) -> None:
    model_path, config_path = voice_files
    import json

    with open(config_path, encoding="utf-8") as fh:
        hparams = vits_torch.hparams_from_config(json.load(fh))
    torch.manual_seed(0)
    model = vits_torch.build_model(hparams)
    random_init = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = vits_torch.load_onnx_weights(model, model_path)
    assert loaded == vits_torch.inference_parameter_names(model)
    still_random = [k for k, v in model.state_dict().items() if torch.equal(v, random_init[k])]
    assert still_random == []


def test_a_parameter_missing_from_the_graph_is_refused(voice_files: tuple[str, str]) -> None:
    model_path, config_path = voice_files
    model, _ = vits_torch.load_voice(model_path, config_path)
    cast(torch.nn.Module, model.dec).register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(EngineUnavailable, match=r"no weights for 1 parameters.*dec\.extra"):
        vits_torch.load_onnx_weights(model, model_path)


def test_parity_with_onnxruntime_with_noise_off(
    engine: PiperTorchEngine, voice_files: tuple[str, str]
) -> None:
    import onnx
    import onnxruntime
    from piper.patch_voice_with_alignment import add_alignment_output

    graph = onnx.load(voice_files[0])
    add_alignment_output(graph)  # expose the integer durations (w_ceil) next to the audio
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    voice: Any = engine._voice(DEFAULT_VOICE)
    for text in SENTENCES[:3]:
        ids = _ids(engine, text)
        ort_audio, ort_ceil = session.run(
            None,
            {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
            },
        )
        ort_durations = ort_ceil.reshape(-1).astype(int).tolist()
        with torch.inference_mode():
            out = vits_torch.infer(
                voice.model, [vits_torch.Utterance(ids, 0.0, 1.0, 0.0)], "cpu", torch.float32
            )[0]
        assert out.durations == ort_durations  # compared first: durations pass through ceil
        with torch.inference_mode():
            forced = vits_torch.Utterance(ids, 0.0, 1.0, 0.0, durations=ort_durations)
            audio = vits_torch.infer(voice.model, [forced], "cpu", torch.float32)[0].audio
        assert audio.size == ort_audio.size
        assert float(np.max(np.abs(audio - ort_audio.reshape(-1)))) < 1e-3


def test_same_seed_same_audio_with_noise(engine: PiperTorchEngine) -> None:
    def speak(seed: int) -> np.ndarray:
        params = VoiceParams(voice=DEFAULT_VOICE, seed=seed)
        return np.concatenate(list(engine.synthesize([SENTENCES[1], SENTENCES[5]], params)))

    first, again, other = speak(7), speak(7), speak(8)
    assert np.array_equal(first, again)
    assert first.size != other.size or not np.allclose(first, other, atol=1e-3)
    # A seeded sentence sounds the same whether it is synthesised alone or in a batch.
    params = VoiceParams(voice=DEFAULT_VOICE, seed=7)
    alone = next(iter(engine.synthesize([SENTENCES[1]], params)))
    batched = engine.synthesize_batch(
        [(SENTENCES[5], VoiceParams(voice=DEFAULT_VOICE, seed=1)), (SENTENCES[1], params)]
    )
    assert isinstance(batched.results[1], np.ndarray)
    assert batched.results[1].size == alone.size
    assert float(np.max(np.abs(batched.results[1] - alone))) < 1e-4


def test_the_request_seed_reaches_the_torch_runtime(torch_synthesizer: Synthesizer, tmp_path: Any) -> None:
    import soundfile as sf

    def speak(name: str, seed: int) -> np.ndarray:
        result = torch_synthesizer.synthesize(SynthesisRequest(SENTENCES[1], seed=seed), str(tmp_path / name))
        audio, _ = sf.read(result.path, dtype="float32")
        return np.asarray(audio)

    assert np.array_equal(speak("a.wav", 3), speak("b.wav", 3))
    assert not any("seed" in n for n in torch_synthesizer.plan(SynthesisRequest("Hi.", seed=3)).not_applied)
    ignored = torch_synthesizer.engine("piper").notes(VoiceParams(voice=DEFAULT_VOICE, seed=3))
    assert ignored == []
    onnx_notes = Synthesizer(engines=["piper"]).plan(SynthesisRequest("Hi.", seed=3)).not_applied
    assert any(n.startswith("seed: onnxruntime") for n in onnx_notes)  # reported, not silently dropped
    with pytest.raises(UnsupportedControl):
        torch_synthesizer.synthesize(SynthesisRequest("Hi.", seed="3"), str(tmp_path / "c.wav"))  # type: ignore[arg-type]


@pytest.mark.slow  # seconds of work: make test runs it, make test-fast leaves it out
def test_batch_of_eight_equals_eight_single_calls(engine: PiperTorchEngine) -> None:
    params = VoiceParams(voice=DEFAULT_VOICE, **QUIET)
    outcome = engine.synthesize_batch([(s, params) for s in SENTENCES])
    assert outcome.forward_passes == 1
    for text, batched in zip(SENTENCES, outcome.results, strict=True):
        single = next(iter(engine.synthesize([text], params)))
        assert isinstance(batched, np.ndarray) and batched.size == single.size
        assert float(np.max(np.abs(batched - single))) < 1e-3


def test_a_failing_request_fails_alone_in_a_batch(engine: PiperTorchEngine) -> None:
    params = VoiceParams(voice=DEFAULT_VOICE, **QUIET)
    outcome = engine.synthesize_batch(
        [(SENTENCES[0], params), ("Hello.", VoiceParams(voice="no-such-voice")), (SENTENCES[1], params)]
    )
    first, failed, last = outcome.results
    assert isinstance(failed, UnknownVoice)
    assert isinstance(first, np.ndarray) and first.size > 10_000
    assert isinstance(last, np.ndarray) and last.size > 5_000


def test_memory_per_job_is_reported(
    engine: PiperTorchEngine, torch_synthesizer: Synthesizer, tmp_path: Any
) -> None:
    outcome = engine.synthesize_batch([(SENTENCES[0], VoiceParams(voice=DEFAULT_VOICE))])
    assert outcome.peak_memory_mb > 50  # CPU: the process's peak RSS during the batch
    result = torch_synthesizer.synthesize(SynthesisRequest(SENTENCES[1], **QUIET), str(tmp_path / "t.wav"))
    assert result.peak_rss_mb > 50 and result.peak_gpu_mb is None and result.device == "cpu"
    assert result.duration_seconds > 0.3


def test_the_synthesizer_runs_piper_on_torch_like_onnxruntime(
    torch_synthesizer: Synthesizer, synthesizer: Synthesizer, tmp_path: Any
) -> None:
    import soundfile as sf

    text = "Hello there. The price is $5.20, paid on 2024-03-01."
    request = SynthesisRequest(text, **QUIET)
    a, _ = sf.read(synthesizer.synthesize(request, str(tmp_path / "ort.wav")).path, dtype="float32")
    b, _ = sf.read(torch_synthesizer.synthesize(request, str(tmp_path / "torch.wav")).path, dtype="float32")
    assert a.size == b.size and float(np.max(np.abs(a - b))) < 2e-3  # 16-bit WAV: one LSB is 3e-5


def test_cuda_is_refused_without_a_cuda_torch() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(EngineUnavailable, match="no CUDA"):
        Synthesizer(device="cuda", engines=["piper"], piper_runtime="torch").load()
    with pytest.raises(ValueError, match="runtime"):
        Synthesizer(piper_runtime="tensorflow")
