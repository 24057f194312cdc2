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
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

PYTHON_VERSION = "3.12"
PLATFORM = "manylinux2014_x86_64"
# import name -> (distribution, version); the versions the project's venv runs, except numpy (above).
REQUIRED: dict[str, tuple[str, str]] = {
    "numpy": ("numpy", "1.26.4"),
    "pynvml": ("nvidia-ml-py", "13.615.71"),
    "psutil": ("psutil", "7.2.2"),
}


def _wheel_prefix(distribution: str, version: str) -> str:
    return f"{distribution.replace('-', '_')}-{version}-"


def find_wheel(wheels: Path, distribution: str, version: str) -> Path | None:
    found = sorted(wheels.glob(_wheel_prefix(distribution, version) + "*.whl"))
    return found[0] if found else None


def download(wheels: Path, pip: list[str] | None = None) -> list[Path]:
    """The Python 3.12 x86-64 wheels of REQUIRED into ``wheels`` (those not there yet)."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = pip or [sys.executable, "-m", "pip"]
    out = []
    for distribution, version in REQUIRED.values():
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
                    "--platform",
                    PLATFORM,
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
    """Import names of REQUIRED that this Python cannot import."""
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def install(wheels: Path, target: Path, names: list[str]) -> list[str]:
    """Install the carried wheels of ``names`` into ``target``; a line per package done."""
    target.mkdir(parents=True, exist_ok=True)
    picked = []
    for name in names:
        distribution, version = REQUIRED[name]
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
        print("wheels: this Python has numpy, pynvml and psutil; nothing installed")
        return 0
    for line in install(Path(args.wheels), Path(args.target), names):
        print(f"wheels: {line} -> {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
