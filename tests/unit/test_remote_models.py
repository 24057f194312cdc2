"""The remote models file (synth/engines/remote.py): each model an engine of the one remote plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth import registry
from synth.engines import remote


def write(tmp_path: Path, models: dict[str, object]) -> Path:
    path = tmp_path / "remote-models.json"
    path.write_text(json.dumps({"models": models}))
    return path


def test_each_remote_model_is_an_installed_engine_with_its_declared_voices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        {
            "cosyvoice3": {
                "upstreams": ["http://127.0.0.1:8091/", "http://127.0.0.1:8092"],
                "voices": [{"id": "alloy", "language": "en-us"}, {"id": "vivian", "language": "zh"}],
                "cloning": True,
            },
            "qwen3-tts": {"upstreams": ["https://gpu.example:8000"], "cloning": True},
        },
    )
    monkeypatch.setenv(registry.REMOTE_MODELS_ENV, str(path))
    assert {"cosyvoice3", "qwen3-tts"} <= set(registry.installed())
    voices = registry.list_voices(engines=["cosyvoice3"])
    assert [v.id for v in voices] == ["cosyvoice3:alloy", "cosyvoice3:vivian"]
    assert {v.engine for v in voices} == {"cosyvoice3"} and voices[1].language == "zh"
    assert voices[0].capabilities["cloning"] is True and voices[0].capabilities["remote"] is True
    model = remote.models()["cosyvoice3"]
    assert model.upstreams == ("http://127.0.0.1:8091", "http://127.0.0.1:8092")
    assert model.upstream_model == "cosyvoice3" and model.languages == ("en-us", "zh")
    # A model with no preset voices serves only voices with a prompt.
    assert [v.id for v in registry.list_voices(engines=["qwen3-tts"])] == ["qwen3-tts:cloned"]


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ({"upstreams": []}, "upstreams"),
        ({"upstreams": ["ftp://host"]}, "upstreams"),
        ({"upstreams": ["http://host"], "voices": []}, "must clone"),
    ],
)
def test_a_model_the_file_cannot_serve_is_refused_with_the_reason(
    tmp_path: Path, model: dict[str, object], why: str
) -> None:
    path = write(tmp_path, {"broken": model})
    with pytest.raises(ValueError, match=why):
        remote.models(str(path))


def test_a_remote_model_cannot_take_a_shipped_engines_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, {"piper": {"upstreams": ["http://127.0.0.1:1"], "cloning": True}})
    monkeypatch.setenv(registry.REMOTE_MODELS_ENV, str(path))
    assert registry.plugin("piper") is not remote.plugin  # the shipped Piper stays Piper


def test_an_upstream_at_an_internal_address_is_warned_of_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = {"upstreams": ["http://10.1.2.3:8091", "https://gpu.example:8000"], "cloning": True}
    with caplog.at_level("WARNING", logger="synth.engines.remote"):
        remote.models(str(write(tmp_path, {"cosyvoice3": model})))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "10.1.2.3" in warned[0] and remote.ALLOW_PRIVATE_ENV in warned[0]
    caplog.clear()
    monkeypatch.setenv(remote.ALLOW_PRIVATE_ENV, "10.0.0.0/8")
    other = tmp_path / "allowed"
    other.mkdir()
    with caplog.at_level("WARNING", logger="synth.engines.remote"):
        remote.models(str(write(other, {"cosyvoice3": model})))
    assert not caplog.records
