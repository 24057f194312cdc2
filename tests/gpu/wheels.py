"""The packages the GPU check needs beyond torch, carried as wheels (no registry on the GPU machine).

``make gpu-check-prepare`` downloads them (:func:`download`, on the CPU machine, which
reaches PyPI); ``tests/gpu/check.sh`` installs the ones the GPU machine's Python lacks
(``python tests/gpu/wheels.py --wheels DIR --target DIR``): with
``pip install --no-index --find-links DIR --target DIR``, or, where that Python has no
pip, by unpacking the wheel (all three are plain wheels with no install scripts). It
never installs torch and never reaches a registry.

What the check imports besides torch and the standard library: numpy (the engine
returns audio as numpy arrays; the references are ``.npz``), pynvml (nvidia-ml-py: the
NVML per-process reading of synth.telemetry) and psutil (synth.telemetry's RSS fallback).
None of the three has a dependency of its own. torch's own dependencies come with the
GPU machine's torch. numpy is 1.26.4: it runs with a torch built against numpy 1.x
(torch 2.2, the first for Python 3.12) and with one built against 2.x, and is within
the project's ``numpy>=1.26``.

The VoxCPM section (tests/gpu/voxcpm_check.py) adds :data:`VOXCPM`: voxcpm 2.0.3 without
its dependencies (most of which it never imports: gradio, funasr, modelscope...) and what
``import voxcpm`` and ``librosa.load`` (its prompt-wav path) need that the GPU machine's
Python lacks. That set was found by importing in a clean venv holding only what the GPU
machine has (torch, torchaudio, transformers, tokenizers, safetensors, einops, numpy,
huggingface-hub, tqdm, scipy, scikit-learn, numba, joblib, msgpack, lazy-loader, psutil,
nvidia-ml-py; packaging and typing_extensions come with those). pydantic is 2.11, whose
``typing-extensions>=4.12.2`` an older machine still meets (2.12 and later want newer).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

PYTHON_VERSION = "3.12"
# pip download tries these in turn (soundfile's wheel is manylinux_2_28 only).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# import name -> (distribution, version); the versions the project's venv runs, except numpy (above).
REQUIRED: dict[str, tuple[str, str]] = {
    "numpy": ("numpy", "1.26.4"),
    "pynvml": ("nvidia-ml-py", "13.615.71"),
    "psutil": ("psutil", "7.2.2"),
}
# The VoxCPM section's: import name -> (distribution, version), 4.7 MiB of wheels.
VOXCPM: dict[str, tuple[str, str]] = {
    "voxcpm": ("voxcpm", "2.0.3"),
    "pydantic": ("pydantic", "2.11.10"),
    "pydantic_core": ("pydantic-core", "2.33.2"),  # pinned by pydantic 2.11.10
    "annotated_types": ("annotated-types", "0.7.0"),
    "typing_inspection": ("typing-inspection", "0.4.1"),
    "librosa": ("librosa", "0.11.0"),
    # librosa.core.audio's imports (librosa.load reads the prompt wav): soundfile brings its
    # own libsndfile and needs cffi's backend only (no pycparser); pooch needs platformdirs.
    "soundfile": ("soundfile", "0.14.0"),
    "cffi": ("cffi", "2.1.1"),
    "audioread": ("audioread", "3.1.0"),
    "soxr": ("soxr", "1.1.0"),
    "decorator": ("decorator", "5.3.1"),
    "pooch": ("pooch", "1.9.0"),
    "platformdirs": ("platformdirs", "4.14.9"),
}
CARRIED: dict[str, tuple[str, str]] = {**REQUIRED, **VOXCPM}


def _wheel_prefix(distribution: str, version: str) -> str:
    return f"{distribution.replace('-', '_')}-{version}-"


def find_wheel(wheels: Path, distribution: str, version: str) -> Path | None:
    found = sorted(wheels.glob(_wheel_prefix(distribution, version) + "*.whl"))
    return found[0] if found else None


def download(wheels: Path, pip: list[str] | None = None) -> list[Path]:
    """The Python 3.12 x86-64 wheels of CARRIED into ``wheels`` (those not there yet)."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = pip or [sys.executable, "-m", "pip"]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    out = []
    for distribution, version in CARRIED.values():
        wheel = find_wheel(wheels, distribution, version)
        if wheel is None:
            subprocess.run(
                [
                    *pip,
                    "download",
                    "-qq",  # errors only: not this machine's index warnings
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    PYTHON_VERSION,
                    *platforms,
                    "--implementation",
                    "cp",
                    "-d",
                    str(wheels),
                    f"{distribution}=={version}",
                ],
                check=True,
            )
            wheel = find_wheel(wheels, distribution, version)
            if wheel is None:
                raise RuntimeError(f"pip download left no wheel of {distribution}=={version} in {wheels}")
        out.append(wheel)
    return out


def fits(name: str) -> bool:
    """Whether a wheel's Python tag suits this Python (``cp312-cp312``, ``cp36-abi3``, ``py3-none``)."""
    python_tag, abi_tag = name[: -len(".whl")].split("-")[-3:-1]
    here = sys.version_info.major * 100 + sys.version_info.minor
    for tag in python_tag.split("."):
        if tag.startswith("py3"):
            return True
        if tag.startswith("cp3"):
            wanted = 300 + int(tag[3:])
            if wanted == here or (abi_tag == "abi3" and wanted <= here):
                return True
    return False


def missing() -> list[str]:
    """Import names of CARRIED that this Python cannot import."""
    return [name for name in CARRIED if importlib.util.find_spec(name) is None]


def install(wheels: Path, target: Path, names: list[str]) -> list[str]:
    """Install the carried wheels of ``names`` into ``target``; a line per package done."""
    target.mkdir(parents=True, exist_ok=True)
    picked = []
    for name in names:
        distribution, version = CARRIED[name]
        wheel = find_wheel(wheels, distribution, version)
        if wheel is None:
            raise SystemExit(f"FAIL: no wheel of {distribution}=={version} in {wheels}")
        picked.append((distribution, version, wheel))
    has_pip = importlib.util.find_spec("pip") is not None
    done = []
    if has_pip:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--upgrade"]
        command += ["--disable-pip-version-check", "--find-links", str(wheels), "--target", str(target)]
        command += [f"{d}=={v}" for d, v, _ in picked]
        if subprocess.run(command, check=False).returncode == 0:
            return [f"pip --no-index: {d}=={v}" for d, v, _ in picked]
    for _distribution, _version, wheel in picked:  # no pip here (or it failed): a wheel is a zip
        if not fits(wheel.name):
            raise SystemExit(
                f"FAIL: {wheel.name} is not for Python {sys.version_info.major}.{sys.version_info.minor}"
            )
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        done.append(f"unpacked {wheel.name}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/gpu/wheels.py")
    parser.add_argument("--wheels", required=True, help="folder of carried wheels (var/gpu-check/wheels)")
    parser.add_argument("--target", required=True, help="folder to install into (put on PYTHONPATH)")
    args = parser.parse_args()
    names = missing()
    if not names:
        print("wheels: this Python has every carried package; nothing installed")
        return 0
    wheels, target = Path(args.wheels), Path(args.target)
    piper = [name for name in names if name in REQUIRED]
    if piper:
        for line in install(wheels, target, piper):
            print(f"wheels: {line} -> {args.target}")
    # VoxCPM's are optional: a folder prepared without them, or one that will not install,
    # must not stop the Piper sections; the VoxCPM section then says why it cannot run.
    voxcpm = [name for name in names if name in VOXCPM]
    found = [find_wheel(wheels, *VOXCPM[name]) for name in voxcpm]
    # All or nothing: half a set (say voxcpm without pydantic_core, on another Python)
    # would make the section fail instead of skip.
    unfit = sorted(w.name for w in found if w is not None and not fits(w.name))
    if voxcpm and None in found:
        print("wheels: the prepared folder lacks VoxCPM's wheels; the VoxCPM section will skip")
    elif unfit:
        print(
            f"wheels: VoxCPM's wheels are not for this Python ({', '.join(unfit)}); the VoxCPM section will skip"
        )
    elif voxcpm:
        try:
            for line in install(wheels, target, voxcpm):
                print(f"wheels: {line} -> {args.target}")
        except (SystemExit, Exception) as exc:
            print(f"wheels: VoxCPM's wheels not installed ({exc}); the VoxCPM section will fail")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
