"""Models an operator manages (issue 50 item 4): TTS_MODELS_DIR/<engine>/, `manage.py models`.

The tiny engine's ``tinyw`` model is one Linear layer whose size its config.json gives; its
weights are a real safetensors file written here. ``models verify`` compares their header with
the layer built on torch's meta device; a worker runs the model only as verified, records it
on each job, and reports it unavailable (health, operations page) while it is not.
"""

from __future__ import annotations

import io
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.integration.api.conftest import wait_finished
from tests.plugin_builds import build_plugin, make_client, python_path
from tests.reliability.helpers import flush_queues, start_worker
from tests.stack import TestStack

SIZES = {"F32": 4, "F16": 2}


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], str]]) -> None:
    """A safetensors file of zeros: the 8-byte header length, the JSON header, the data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (shape, dtype) in tensors.items():
        size = SIZES[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def model_dir(root: Path, tensors: dict[str, tuple[list[int], str]], hidden: int = 4) -> Path:
    directory = root / "tinyw"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"engine": "tinyw", "hidden": hidden}))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


GOOD = {"weight": ([4, 4], "F32"), "bias": ([4], "F32")}
BROKEN = {"weight": ([4, 3], "F16")}  # bias missing, weight of the wrong shape and dtype


def manage(*args: str, err: io.StringIO | None = None) -> str:
    """``manage.py <args>``'s output (what it writes to stderr goes to ``err``)."""
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=err or io.StringIO())
    return out.getvalue()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plugin(tmp_path_factory.mktemp("tinyw"))


@pytest.fixture
def models_root(tmp_path: Path, site: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import sys

    monkeypatch.syspath_prepend(str(site))  # `manage.py models` runs where the engine is installed
    settings.TTS_MODELS_DIR = str(tmp_path / "models")
    yield tmp_path / "models"
    sys.modules.pop("tiny_tts_engine", None)


def test_verify_names_each_missing_or_wrong_tensor_and_records_nothing(models_root: Path) -> None:
    directory = model_dir(models_root, BROKEN)
    err = io.StringIO()
    with pytest.raises(CommandError, match="3 problem"):
        manage("models", "verify", "tinyw", err=err)
    assert "missing tensor bias" in err.getvalue()
    assert "tensor weight: shape [4, 3], the model has [4, 4]" in err.getvalue()
    assert "tensor weight: dtype float16, the model has float32" in err.getvalue()
    assert not (directory / ".tts-verified.json").exists()
    assert "tinyw\tengine tinyw\tnot verified" in manage("models")


def test_verify_refuses_a_truncated_weights_file_by_name(models_root: Path) -> None:
    directory = model_dir(models_root, GOOD)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CommandError, match="tensor bias: its data lies past the end of the file"):
        manage("models", "verify", "tinyw")


def test_verify_records_the_checksum_of_a_good_model_and_the_list_shows_it(models_root: Path) -> None:
    model_dir(models_root, GOOD)
    assert "tinyw: ok, sha256:" in manage("models", "verify", "tinyw")
    checksum = json.loads((models_root / "tinyw" / ".tts-verified.json").read_text())["checksum"]
    assert f"tinyw\tengine tinyw\tverified {checksum}" in manage("models")
    (models_root / "tinyw" / "config.json").write_text(json.dumps({"engine": "tinyw", "hidden": 4, "x": 1}))
    assert "not verified (or changed since)" in manage("models")  # edited after: verify again


@pytest.mark.django_db(transaction=True)
def test_a_worker_reports_an_unverified_model_unavailable_then_runs_it_verified_and_jobs_record_it(
    stack: TestStack, models_root: Path, site: Path, no_session_worker: None
) -> None:
    from django.test import Client

    from webapp.console.operations import page_data
    from webapp.speech.models import SynthesisJob

    flush_queues(stack, "synth.tinyw", "synth.espeak")
    model_dir(models_root, BROKEN)
    worker = start_worker(
        stack,
        "models-w1",
        engines="espeak,tinyw",
        PYTHONPATH=python_path(site),
        TTS_MODELS_DIR=str(models_root),
    )
    try:
        beats = [b for b in stack.heartbeats() if "tinyw" in (b.get("unavailable") or {})]
        assert beats and "manage.py models verify tinyw" in beats[0]["unavailable"]["tinyw"], beats
        assert beats[0]["state"] == "ready" and beats[0]["engines"] == ["espeak"]  # started, no crash loop
        ready = Client().get("/healthz/ready").json()
        assert ready["engines_unavailable"] == ["tinyw"], ready
        assert ("tinyw", beats[0]["unavailable"]["tinyw"]) in page_data()["unavailable_engines"]
    finally:
        stack.stop_service(worker)

    model_dir(models_root, GOOD)
    manage("models", "verify", "tinyw")
    checksum = json.loads((models_root / "tinyw" / ".tts-verified.json").read_text())["checksum"]
    deadline = time.monotonic() + 15  # the first worker's beats lapse (TTL 3 s)
    while any("tinyw" in (b.get("unavailable") or {}) for b in stack.heartbeats()):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    worker = start_worker(
        stack,
        "models-w2",
        engines="espeak,tinyw",
        PYTHONPATH=python_path(site),
        TTS_MODELS_DIR=str(models_root),
    )
    try:
        _, _, client = make_client()
        r = client.post("/api/v1/speech", {"text": "Hello.", "voice": "tinyw:beep"})
        assert r.status_code == 202, r.content
        assert wait_finished(client, r.json()["id"], timeout=60)["status"] == "succeeded"
        metrics = SynthesisJob.objects.get(pk=r.json()["id"]).metrics
        assert metrics["model"] == "tinyw" and metrics["model_checksum"] == checksum
    finally:
        stack.stop_service(worker)
