"""Files for a GPU check run: ``make gpu-check-prepare`` (``python -m tests.gpu.prepare``).

A GPU check machine gets a copy of the working tree plus at most 64 MiB in all of
carried files, has a Python 3.12 with CUDA torch and nothing else of this project's,
and reaches no registry. So, on this (CPU) machine, this writes to ``--out`` (default
``var/gpu-check``, ignored by git; about 54 MiB):

- ``weights.pt``: the voice's inference weights as the engine's own loader
  extracted them from its .onnx (synth.engines.vits_torch), in fp16, with the
  model hyperparameters (30 MiB);
- ``utterances.json``: phoneme ids for the check's sentences (phonemised here by
  piper/eSpeak), the sample rate, the voice's noise scales, the seeds, and these
  references made here: onnxruntime's durations of every sentence with the noise
  off; the CPU float32 durations of the reference sentences with the noise on and
  their seeds; what made them (torch, onnxruntime, numpy, Python versions); the
  baseline of torch CPU float32 against onnxruntime on this machine, and what the
  fp16 rounding of the weights alone changes in onnxruntime's output;
- ``references.npz``: waveforms of the reference sentences: ``ort_<i>``,
  onnxruntime with the noise off, run on the voice's graph with the weights of
  ``weights.pt`` put back into it (so torch and onnxruntime run the same weights and
  differ by the runtime alone); ``cpu_<i>``, the torch engine in float32 on this
  CPU from ``weights.pt`` with the noise on, seeded (``seeds[i]``): the reference
  fp16 on CUDA is measured against, same text and seed;
- ``pysrc/piper/train/vits/``: piper-tts's VITS model code (the files the model
  needs, with empty package ``__init__`` files), put on PYTHONPATH there;
- ``wheels/``: Python 3.12 x86-64 wheels of numpy, nvidia-ml-py and psutil, and for
  the VoxCPM section voxcpm 2.0.3 (no dependencies) with what its imports need that
  the GPU machine lacks (pydantic, librosa, soundfile...: 4.7 MiB; tests/gpu/wheels.py;
  downloaded once, kept on a rerun), installed there only when that Python lacks
  them. Not torch: the GPU machine brings its own. No VoxCPM weights: the VoxCPM
  section builds its tiny random-weight model there (tests/gpu/voxcpm_tiny.py).

onnxruntime therefore never runs on the GPU machine: its figures come from here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

SENTENCES = [
    "The keeper climbed the stairs and trimmed the wick while the ships passed in the dark.",
    "Hello there!",
    "A third sentence, somewhat longer than the second one, so the batch needs padding.",
    "Numbers such as forty-two are read as words.",
    "Is this a question, or is it not?",
    "Short.",
    "Every job keeps its own claim, its own progress and its own time limit.",
    "Eight sentences make one batch, and thirty-two make four of them.",
]
MODEL_FILES = ("__init__.py", "models.py", "modules.py", "attentions.py", "commons.py", "transforms.py")
# The sentences with reference waveforms (long, short, medium, a question: 12 s of audio).
REFERENCE_SENTENCES = (0, 1, 3, 4)
QUICK_REFERENCES = (1, 5)  # the two shortest: make test's own CPU run
SEEDS = [1000 + i for i in range(len(SENTENCES))]
DEFAULT_SCALES = {"noise_scale": 0.667, "length_scale": 1.0, "noise_w": 0.8}  # Piper's, when a voice has none
LIMIT_MB = 64  # what the device tool carries, the working tree (2 MiB) included


def _phoneme_ids() -> tuple[list[list[int]], int]:
    from synth.engines.base import VoiceParams
    from synth.engines.piper import PiperEngine
    from synth.registry import DEFAULT_VOICE

    engine = PiperEngine(threads=1)
    engine.load("cpu", [DEFAULT_VOICE])
    voice = engine._voice(DEFAULT_VOICE)
    params = VoiceParams(voice=DEFAULT_VOICE)
    ids = [voice.phonemes_to_ids(voice.phonemize(engine.render(s, params))[0]) for s in SENTENCES]
    return ids, int(voice.config.sample_rate)


def _rounded_graph(model_path: str, model: Any) -> Any:
    """The voice's ONNX graph with its weights replaced by ``model``'s (the fp16-rounded ones).

    onnxruntime then runs the very weights the torch check runs (the inverse of
    vits_torch.load_onnx_weights), so torch and onnxruntime differ by the runtime alone.
    """
    import onnx
    import torch
    from onnx import numpy_helper

    from synth.engines import vits_torch as vt

    state = model.state_dict()
    graph = onnx.load(model_path)
    tensors = {t.name: t for t in graph.graph.initializer}
    targets = {name: name for name in tensors if name in state}
    found = vt._consumer_targets(graph.graph, set(tensors))
    targets.update({k: v for k, v in found.items() if k not in targets})
    for source, target in targets.items():
        if target not in state:
            continue
        value = state[target].detach().float()
        if target == "dp.flows.0.logs":
            value = torch.exp(-value)  # the graph holds exp(-logs)
        original = numpy_helper.to_array(tensors[source])
        rounded = value.numpy().astype(original.dtype).reshape(original.shape)
        tensors[source].CopyFrom(numpy_helper.from_array(rounded, name=source))
    return graph


def _onnxruntime(graph: Any, ids: list[list[int]]) -> tuple[list[list[int]], list[Any]]:
    """onnxruntime's durations and audio per sentence, noise off (scales 0, 1, 0)."""
    import numpy as np
    import onnxruntime
    from piper.patch_voice_with_alignment import add_alignment_output

    add_alignment_output(graph)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    session = onnxruntime.InferenceSession(
        graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    durations, audio = [], []
    for row in ids:
        feed = {
            "input": np.array([row], dtype=np.int64),
            "input_lengths": np.array([len(row)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        }
        wave, alignment = session.run(None, feed)[:2]
        durations.append(alignment.reshape(-1).astype(int).tolist())
        audio.append(wave.reshape(-1).astype(np.float32))
    return durations, audio


def _copy_model_code(out: Path) -> None:
    import piper.train.vits as vits

    target = out / "pysrc" / "piper" / "train" / "vits"
    target.mkdir(parents=True, exist_ok=True)
    for package in (out / "pysrc" / "piper", out / "pysrc" / "piper" / "train"):
        (package / "__init__.py").write_text('"""Copied for the GPU check (piper-tts model code only)."""\n')
    source = Path(vits.__file__).parent
    for name in MODEL_FILES:
        shutil.copyfile(source / name, target / name)


def _cpu_references(
    model: Any,
    ids: list[list[int]],
    picked: tuple[int, ...],
    ort_durations: list[list[int]],
    scales: dict[str, float],
) -> tuple[list[Any], list[list[int]], list[Any]]:
    """torch CPU float32 from the prepared (fp16-rounded) weights, for the sentences ``picked``.

    Per sentence: seeded audio with the noise on and its durations (what fp16 on CUDA is
    compared with), and audio with the noise off and onnxruntime's durations (the
    baseline of torch against onnxruntime on this machine).
    """
    import torch

    from synth.engines import vits_torch as vt

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    vt.place(model, "cpu", torch.float32)
    noise = (scales["noise_scale"], scales["length_scale"], scales["noise_w"])
    with torch.inference_mode():
        seeded = vt.infer(
            model,
            [vt.Utterance(ids[i], *noise, torch.Generator().manual_seed(SEEDS[i])) for i in picked],
            "cpu",
            torch.float32,
        )
        quiet = vt.infer(
            model,
            [vt.Utterance(ids[i], 0.0, 1.0, 0.0, durations=ort_durations[i]) for i in picked],
            "cpu",
            torch.float32,
        )
    return [o.audio for o in seeded], [o.durations for o in seeded], [o.audio for o in quiet]


def prepare(out: Path, wheels: bool = True, quick: bool = False) -> list[Path]:
    """Write the prepared folder.

    ``wheels=False`` downloads nothing. ``quick`` (the CPU check in ``make test``, which
    prepares into a temporary folder): references for the two shortest sentences only, and
    no comparison with the shipped weights, to keep that run short on a 2-core machine.
    """
    import numpy as np
    import onnx
    import onnxruntime
    import torch

    from synth.engines import vits_torch
    from synth.registry import DEFAULT_VOICE, piper_voice_files
    from tests.gpu import engine_check

    out.mkdir(parents=True, exist_ok=True)
    model_path, config_path = piper_voice_files(None)[DEFAULT_VOICE]
    model, hparams = vits_torch.load_voice(model_path, config_path)
    vits_torch.save_prepared(model, hparams, str(out / "weights.pt"))
    del model
    rounded, _ = vits_torch.load_prepared(str(out / "weights.pt"))  # what the check will run
    ids, rate = _phoneme_ids()
    with open(config_path, encoding="utf-8") as fh:
        inference = json.load(fh).get("inference", {})
    scales = {k: float(inference.get(k, v)) for k, v in DEFAULT_SCALES.items()}
    picked = QUICK_REFERENCES if quick else REFERENCE_SENTENCES
    # quick: onnxruntime for the reference sentences only (the others' entries are None).
    ort_ids = [ids[i] for i in picked] if quick else ids
    found_durations, found_audio = _onnxruntime(_rounded_graph(model_path, rounded), ort_ids)
    where = list(picked) if quick else list(range(len(ids)))
    ort_durations: list[Any] = [None] * len(ids)
    ort_audio: list[Any] = [None] * len(ids)
    for k, i in enumerate(where):
        ort_durations[i], ort_audio[i] = found_durations[k], found_audio[k]
    cpu_audio, cpu_durations, quiet_audio = _cpu_references(rounded, ids, picked, ort_durations, scales)
    refs = [ort_audio[i] for i in picked]
    baseline = engine_check.compare_all(
        refs, quiet_audio, rate, "onnxruntime, the same weights", "torch float32 CPU (prepare machine)"
    )
    rounding = None
    if not quick:
        shipped_durations, shipped_audio = _onnxruntime(onnx.load(model_path), [ids[i] for i in picked])
        rounding = engine_check.compare_all(
            shipped_audio,
            refs,
            rate,
            "onnxruntime, the voice's fp32 weights",
            "onnxruntime, fp16-rounded weights",
        )
        rounding["durations"] = engine_check.durations_diff(
            shipped_durations, [ort_durations[i] for i in picked]
        )
    arrays = {f"ort_{i}": ort_audio[i] for i in picked}
    arrays.update({f"cpu_{i}": a for i, a in zip(picked, cpu_audio, strict=True)})
    np.savez(out / "references.npz", **arrays)  # type: ignore[arg-type]
    data = {
        "voice": DEFAULT_VOICE,
        "sample_rate": rate,
        "sentences": SENTENCES,
        "phoneme_ids": ids,
        "scales": scales,
        "seeds": SEEDS,
        "reference_sentences": list(picked),
        "onnxruntime_durations": ort_durations,
        "cpu_fp32_durations": {str(i): d for i, d in zip(picked, cpu_durations, strict=True)},
        "prepared_with": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__,
            "machine": platform.machine(),
            "cpu_reference": "torch float32 on the CPU of the machine that ran make gpu-check-prepare",
        },
        "baseline_torch_cpu_fp32_vs_onnxruntime": baseline,
        "weights_fp16_rounding_onnxruntime": rounding,
    }
    (out / "utterances.json").write_text(json.dumps(data), encoding="utf-8")
    _copy_model_code(out)
    if wheels:
        from tests.gpu import wheels as carried

        carried.download(out / "wheels")
    return sorted(p for p in out.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.prepare")
    parser.add_argument("--out", default=os.path.join("var", "gpu-check"))
    parser.add_argument("--no-wheels", action="store_true", help="skip the wheels (downloads nothing)")
    args = parser.parse_args()
    files = prepare(Path(args.out), wheels=not args.no_wheels)
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size / 2**20:8.2f} MiB  {p}")
    print(
        f"{total / 2**20:.1f} MiB in {len(files)} files (the device tool carries {LIMIT_MB} MiB with the tree)"
    )
    return 0 if total < (LIMIT_MB - 8) * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
