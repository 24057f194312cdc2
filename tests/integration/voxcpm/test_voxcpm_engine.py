"""The VoxCPM engine on the tiny random-weight VoxCPM2 (issue 51): loading, streaming, seed, cancel, limits.

Its audio is noise: these assert plumbing (rates, lengths, order, seeds, refusals), never quality.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from synth.engines.base import VoiceParams, VoicePrompt
from synth.engines.voxcpm import VoxCPMEngine
from synth.errors import Cancelled, EngineUnavailable
from tests.integration.voxcpm.conftest import copy_model

VOICE = "voxcpm:default"
EXTRAS = ("gradio", "funasr", "modelscope", "datasets", "torchaudio", "torchcodec", "matplotlib", "spaces")


def samples_per_patch(engine: Any) -> int:
    vae = engine.model.audio_vae
    return int(engine.model.patch_size * vae.decode_chunk_size)


def write_prompt(path: Path, hz: float) -> VoicePrompt:
    rate = 16000
    t = np.arange(rate) / rate
    audio = 0.3 * np.sin(2 * math.pi * hz * t)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((audio * 32767).astype("<i2").tobytes())
    return VoicePrompt(str(path), rate, transcript="This is the voice to follow.")


def test_it_loads_the_tiny_model_in_float32_on_the_cpu_at_its_vae_output_rate(voxcpm_engine: Any) -> None:
    assert voxcpm_engine.dtype == "float32" and voxcpm_engine.device == "cpu"
    assert {str(p.dtype) for p in voxcpm_engine.model.parameters()} == {"torch.float32"}
    assert voxcpm_engine.sample_rate(VOICE) == 48000  # the config's audio_vae_config.out_sample_rate
    assert sum(p.numel() for p in voxcpm_engine.model.parameters()) < 1_000_000


def test_each_sentence_is_whole_patches_within_the_length_derived_from_its_text(voxcpm_engine: Any) -> None:
    texts = ["Hello there.", "The keeper climbed the stairs and trimmed the wick."]
    out = list(voxcpm_engine.synthesize(texts, VoiceParams(voice=VOICE, seed=3)))
    per_patch = samples_per_patch(voxcpm_engine)
    assert len(out) == 2
    for text, audio in zip(texts, out, strict=True):
        assert audio.dtype == np.float32 and audio.size > 0 and audio.size % per_patch == 0
        assert audio.size // per_patch <= voxcpm_engine.max_patches(text, 0)
    assert voxcpm_engine.max_patches(texts[0], 0) == voxcpm_engine.text_tokens(texts[0]) * 6 + 10


def test_the_first_sentence_arrives_before_the_next_is_asked_for(voxcpm_engine: Any) -> None:
    asked: list[str] = []

    def chunks() -> Any:
        for text in ("First one.", "Second one."):
            asked.append(text)
            yield text

    audio = voxcpm_engine.synthesize(chunks(), VoiceParams(voice=VOICE, seed=1))
    first = next(audio)
    assert first.size > 0 and asked == ["First one."]
    assert next(audio).size > 0 and asked == ["First one.", "Second one."]


def test_a_cancel_is_seen_within_one_generated_patch(voxcpm_engine: Any) -> None:
    calls = []

    def should_cancel() -> bool:
        calls.append(1)
        return len(calls) > 1  # the job is canceled once its first check has passed

    with pytest.raises(Cancelled):
        list(
            voxcpm_engine.synthesize(
                ["A sentence of some length."], VoiceParams(voice=VOICE), None, should_cancel
            )
        )
    assert len(calls) == 2  # before the sentence, then after its first patch: no second patch ran
    assert list(voxcpm_engine.synthesize(["Still usable."], VoiceParams(voice=VOICE)))[0].size > 0


def test_the_same_seed_gives_identical_audio_and_another_seed_different(voxcpm_engine: Any) -> None:
    def run(seed: int) -> np.ndarray:
        return np.concatenate(
            list(voxcpm_engine.synthesize(["Hello there.", "Again."], VoiceParams(VOICE, seed=seed)))
        )

    first, again, other = run(7), run(7), run(8)
    assert np.array_equal(first, again)
    assert first.shape != other.shape or not np.array_equal(first, other)


def test_two_prompts_give_different_audio_and_one_prompt_the_same_twice(
    voxcpm_engine: Any, tmp_path: Path
) -> None:
    low, high = write_prompt(tmp_path / "low.wav", 150), write_prompt(tmp_path / "high.wav", 600)

    def run(prompt: VoicePrompt) -> np.ndarray:
        return list(voxcpm_engine.synthesize(["Hello there."], VoiceParams(VOICE, seed=5, prompt=prompt)))[0]

    a, b = run(low), run(high)
    assert np.array_equal(a, run(low))
    assert a.shape != b.shape or not np.array_equal(a, b)
    assert voxcpm_engine.prompt_patches(VoiceParams(VOICE, prompt=low)) > voxcpm_engine.text_tokens(
        low.transcript
    )


def test_a_text_longer_than_the_context_is_split_on_words(voxcpm_engine: Any) -> None:
    text = " ".join(["word"] * 120)  # ~600 tokens: its patches would not fit 512 positions
    pieces = voxcpm_engine.pieces(text, 0)
    assert len(pieces) > 1 and " ".join(pieces) == text
    assert all(voxcpm_engine.max_patches(p, 0) >= 4 for p in pieces)
    out = list(voxcpm_engine.synthesize([text], VoiceParams(VOICE, seed=1)))
    assert len(out) == 1 and out[0].size % samples_per_patch(voxcpm_engine) == 0


def test_it_refuses_a_checkpoint_with_layers_removed(voxcpm_model: Path, tmp_path: Path) -> None:
    directory = copy_model(voxcpm_model, tmp_path / "voxcpm")
    state = load_file(str(directory / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layers.0." not in k}, str(directory / "model.safetensors"))
    with pytest.raises(
        EngineUnavailable, match=r"does not match the model: \d+ missing \(e\.g\. base_lm\.layers\.0\."
    ):
        VoxCPMEngine(str(directory)).load("cpu")


def test_it_refuses_a_checkpoint_with_an_unexpected_tensor(voxcpm_model: Path, tmp_path: Path) -> None:
    directory = copy_model(voxcpm_model, tmp_path / "voxcpm")
    state = load_file(str(directory / "model.safetensors"))
    state["extra.weight"] = state["stop_head.weight"].clone()
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(EngineUnavailable, match=r"1 unexpected \(e\.g\. extra\.weight\)"):
        VoxCPMEngine(str(directory)).load("cpu")


def test_it_refuses_a_truncated_weights_file(voxcpm_model: Path, tmp_path: Path) -> None:
    directory = copy_model(voxcpm_model, tmp_path / "voxcpm")
    weights = directory / "audiovae.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(EngineUnavailable, match="unreadable weights"):
        VoxCPMEngine(str(directory)).load("cpu")


def test_verify_names_the_layers_removed_from_the_published_layout(
    voxcpm_models: Path, voxcpm_site: Path
) -> None:
    from synth import models

    directory = copy_model(voxcpm_models / "voxcpm", voxcpm_models / "voxcpm-cut")
    state = load_file(str(directory / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layers.0." not in k}, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "engine": "voxcpm"}))
    sys.path.append(str(voxcpm_site))
    try:
        report = models.verify(voxcpm_models, "voxcpm-cut")
    finally:
        sys.path.remove(str(voxcpm_site))
    assert not report.ok and any(m.startswith("base_lm.layers.0.") for m in report.missing), report.lines()


def test_voxcpm_1_5_is_unavailable_where_torchaudio_does_not_import(
    voxcpm_model: Path, tmp_path: Path
) -> None:
    directory = copy_model(voxcpm_model, tmp_path / "voxcpm")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architecture": "voxcpm"}))
    with pytest.raises(EngineUnavailable, match="torchaudio"):
        VoxCPMEngine(str(directory)).load("cpu")


def test_loading_voxcpm2_imports_neither_torchaudio_nor_the_packages_hub_code(voxcpm_model: Path) -> None:
    code = (
        "import sys; from synth.engines.voxcpm import VoxCPMEngine; e = VoxCPMEngine(sys.argv[1]); e.load('cpu');"
        "print(sorted(m for m in ('torchaudio', 'voxcpm.core', 'voxcpm.model.voxcpm') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(voxcpm_model)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "Running on device" not in done.stderr and "it/s" not in done.stderr  # no prints, no progress bar


def pins(path: Path) -> set[str]:
    lines = path.read_text().lower().splitlines()
    return {line.split("==")[0] for line in lines if "==" in line and not line.startswith((" ", "#"))}


def test_the_worker_image_installs_voxcpm_without_its_declared_extras() -> None:
    """What the gpu worker image installs is pinned in the two locks (pip-install.sh constrains by them)."""
    import importlib.util

    from deploy.container.requirements import requirements
    from deploy.provision import ROOT

    lock, nodeps = pins(ROOT / "deploy/requirements.lock"), pins(ROOT / "deploy/requirements-nodeps.lock")
    assert nodeps == {"voxcpm"} and "voxcpm" not in lock
    assert (
        '--no-deps -r "$build/requirements-nodeps.lock"'
        in (ROOT / "deploy/container/pip-install.sh").read_text()
    )
    assert "pip-install.sh worker analysis gpu voxcpm" in (ROOT / "deploy/container/Dockerfile").read_text()
    wanted = {
        r.split("=")[0].split(">")[0].split("<")[0].lower()
        for r in requirements(ROOT / "pyproject.toml", ["voxcpm"])
    }
    assert {"transformers", "tokenizers", "safetensors", "einops", "librosa", "pydantic", "tqdm"} <= wanted
    assert wanted - {"torch"} <= lock
    assert [e for e in EXTRAS if e in lock | nodeps | wanted] == []
    assert [e for e in EXTRAS if importlib.util.find_spec(e) is not None] == []  # nor in this venv
