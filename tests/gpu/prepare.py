"""Files for a GPU check run: ``make gpu-check-prepare`` (``python -m tests.gpu.prepare``).

A GPU check machine gets a copy of the working tree plus at most 64 MiB of
prepared files, and has its own Python and CUDA torch but not piper-tts, onnx
or the voice package. So, on this (CPU) machine, this writes to ``--out``
(default ``var/gpu-check``):

- ``weights.pt``: the voice's inference weights as the engine's own loader
  extracted them from its .onnx (synth.engines.vits_torch), in fp16, with
  the model hyperparameters;
- ``utterances.json``: phoneme ids for the check's sentences (phonemised here
  by piper/eSpeak), the sample rate, and the onnxruntime durations of the
  first sentences with the noise off (a reference the fp32 run must match);
- ``pysrc/piper/train/vits/``: piper-tts's VITS model code (the files the
  model needs, with empty package ``__init__`` files), put on PYTHONPATH there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

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
REFERENCE_SENTENCES = 2


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


def _onnx_durations(model_path: str, ids: list[list[int]]) -> list[list[int]]:
    import numpy as np
    import onnx
    import onnxruntime
    from piper.patch_voice_with_alignment import add_alignment_output

    graph = onnx.load(model_path)
    add_alignment_output(graph)
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    out = []
    for row in ids:
        feed = {
            "input": np.array([row], dtype=np.int64),
            "input_lengths": np.array([len(row)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        }
        out.append(session.run(None, feed)[1].reshape(-1).astype(int).tolist())
    return out


def _copy_model_code(out: Path) -> None:
    import piper.train.vits as vits

    target = out / "pysrc" / "piper" / "train" / "vits"
    target.mkdir(parents=True, exist_ok=True)
    for package in (out / "pysrc" / "piper", out / "pysrc" / "piper" / "train"):
        (package / "__init__.py").write_text('"""Copied for the GPU check (piper-tts model code only)."""\n')
    source = Path(vits.__file__).parent
    for name in MODEL_FILES:
        shutil.copyfile(source / name, target / name)


def prepare(out: Path) -> list[Path]:
    from synth.engines import vits_torch
    from synth.registry import DEFAULT_VOICE, piper_voice_files

    out.mkdir(parents=True, exist_ok=True)
    model_path, config_path = piper_voice_files(None)[DEFAULT_VOICE]
    model, hparams = vits_torch.load_voice(model_path, config_path)
    vits_torch.save_prepared(model, hparams, str(out / "weights.pt"))
    ids, rate = _phoneme_ids()
    reference = _onnx_durations(model_path, ids[:REFERENCE_SENTENCES])
    data = {"voice": DEFAULT_VOICE, "sample_rate": rate, "sentences": SENTENCES, "phoneme_ids": ids}
    data["onnxruntime_durations"] = reference
    (out / "utterances.json").write_text(json.dumps(data), encoding="utf-8")
    _copy_model_code(out)
    return sorted(p for p in out.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.prepare")
    parser.add_argument("--out", default=os.path.join("var", "gpu-check"))
    args = parser.parse_args()
    files = prepare(Path(args.out))
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size / 2**20:8.2f} MiB  {p}")
    print(f"{total / 2**20:.1f} MiB in {len(files)} files (limit 64 MiB)")
    return 0 if total < 64 * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
