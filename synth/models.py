"""Model directories an operator manages: ``TTS_MODELS_DIR/<engine>/`` (docs/engines.md).

A directory holds the model's ``config.json`` and its weights as ``*.safetensors``. Verifying
reads the weights' headers only (names, shapes, dtypes: the safetensors format is an 8-byte
little-endian header length, then that much JSON) and compares them with the tensors the
engine's own model has when built from the config (on torch's meta device: no memory, no
weights), so a truncated download, a wrong variant or a renamed layer is named before a
worker tries to load it. The verified state is recorded beside the weights with their
checksum; a worker loads a directory whose files still match that record and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD = ".tts-verified.json"
MAX_HEADER_BYTES = 100 * 2**20  # a header past this is not a model's (safetensors caps it the same)
# safetensors' dtype names -> torch's
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

TensorSpec = tuple[tuple[int, ...], str]  # shape, dtype (torch's name)


class ModelError(Exception):
    """A model directory that cannot be used, in words an operator acts on."""


@dataclass
class Report:
    """What ``verify`` found; ``ok`` when nothing is missing or wrong."""

    name: str
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    checksum: str = ""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong)

    def lines(self) -> list[str]:
        out = [f"missing tensor {k}" for k in self.missing]
        out += [f"unexpected tensor {k}" for k in self.unexpected]
        return out + self.wrong


def read_header(path: Path) -> dict[str, TensorSpec]:
    """The tensors a .safetensors file declares (raises ModelError for a file that is not one)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ModelError(f"{path.name}: shorter than a safetensors header")
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER_BYTES:
                raise ModelError(f"{path.name}: header of {size} bytes; not a safetensors file")
            header = json.loads(fh.read(size))
            total = os.fstat(fh.fileno()).st_size - 8 - size
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path.name}: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelError(f"{path.name}: the header is not a JSON object")
    out: dict[str, TensorSpec] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = tuple(int(d) for d in info["shape"])
            dtype = DTYPES[info["dtype"]]
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{path.name}: tensor {name}: malformed entry ({exc})") from exc
        if not 0 <= start <= end <= total:
            raise ModelError(
                f"{path.name}: tensor {name}: its data lies past the end of the file (truncated?)"
            )
        out[name] = (shape, dtype)
    return out


def weight_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def read_config(directory: Path) -> dict[str, Any]:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelError(f"{directory.name}: no config.json") from exc
    except (OSError, ValueError) as exc:
        raise ModelError(f"{directory.name}: config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{directory.name}: config.json is not a JSON object")
    return config


def declared_tensors(directory: Path) -> dict[str, TensorSpec]:
    files = weight_files(directory)
    if not files:
        raise ModelError(f"{directory.name}: no *.safetensors weights")
    tensors: dict[str, TensorSpec] = {}
    for path in files:
        tensors.update(read_header(path))
    return tensors


def compare(name: str, declared: dict[str, TensorSpec], expected: dict[str, TensorSpec]) -> Report:
    report = Report(name)
    report.missing = sorted(set(expected) - set(declared))
    report.unexpected = sorted(set(declared) - set(expected))
    for key in sorted(set(expected) & set(declared)):
        (shape, dtype), (want_shape, want_dtype) = declared[key], expected[key]
        if tuple(shape) != tuple(want_shape):
            report.wrong.append(f"tensor {key}: shape {list(shape)}, the model has {list(want_shape)}")
        if dtype != want_dtype:
            report.wrong.append(f"tensor {key}: dtype {dtype}, the model has {want_dtype}")
    return report


def checksum(directory: Path) -> str:
    """sha256 over the config and the weights (names and bytes), read in blocks."""
    digest = hashlib.sha256()
    for path in [directory / "config.json", *weight_files(directory)]:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as fh:
            while block := fh.read(4 * 2**20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def _stamp(directory: Path) -> list[list[Any]]:
    """Each file's name, size and mtime: what a worker compares with the record (no re-hash)."""
    out = []
    for path in [directory / "config.json", *weight_files(directory)]:
        st = path.stat()
        out.append([path.name, st.st_size, st.st_mtime_ns])
    return out


def record(directory: Path, report: Report) -> None:
    body = {"checksum": report.checksum, "files": _stamp(directory), "verified_at": time.time()}
    tmp = directory / (RECORD + ".tmp")
    tmp.write_text(json.dumps(body), encoding="utf-8")
    os.replace(tmp, directory / RECORD)


def recorded(directory: Path) -> dict[str, Any] | None:
    """The verification record, if its files are still the ones verified; else None."""
    try:
        body = json.loads((directory / RECORD).read_text(encoding="utf-8"))
        if body.get("files") == _stamp(directory):
            return dict(body)
    except (OSError, ValueError):
        pass
    return None


def meta_tensors(module: Any) -> dict[str, TensorSpec]:
    """A torch module's parameters and buffers as shapes and dtypes (build it on ``torch.device("meta")``)."""
    return {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in module.state_dict().items()}


def model_dirs(root: str | os.PathLike[str] | None) -> list[Path]:
    """The model directories under ``root`` (each a folder with a config.json), by name."""
    if not root or not Path(root).is_dir():
        return []
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and (p / "config.json").is_file())


def engine_of(directory: Path) -> str:
    """The engine a model directory is for: its config's ``engine``, else the folder's name."""
    return str(read_config(directory).get("engine") or directory.name)


def verify(root: str | os.PathLike[str], name: str) -> Report:
    """Compare ``root/name``'s weights with its engine's model built from its config; record it when ok."""
    from synth import registry

    directory = Path(root) / name
    if not directory.is_dir():
        raise ModelError(f"no model directory {directory}")
    config = read_config(directory)
    engine = str(config.get("engine") or name)
    try:
        plugin = registry.plugin(engine)
    except ValueError as exc:
        raise ModelError(str(exc)) from exc
    expected_fn = getattr(plugin, "expected_tensors", None)
    if expected_fn is None:
        raise ModelError(f"engine {engine} cannot verify a model (its plugin has no expected_tensors)")
    report = compare(name, declared_tensors(directory), expected_fn(config))
    if report.ok:
        report.checksum = checksum(directory)
        record(directory, report)
    return report


__all__ = ["ModelError", "Report", "meta_tensors", "model_dirs", "recorded", "verify"]
