"""A smoke test of the remote engine against a real server that speaks vLLM-Omni's surface: a second
instance of this service (its own gunicorn, over HTTP) is the upstream of a remote model, and its
``/v1/audio/speech`` answers the sentences with Piper (issue 57)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.helpers import make_org, start_worker, submit, wait_status
from tests.stack import TestStack, tcp_gunicorn

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "loopback"
TEXT = "A remote model speaks here. Its upstream is this very service."


@pytest.fixture
def upstream_tenant(builtin_voices: list[str], synth_worker: Any) -> tuple[Any, str]:
    """The tenant whose key the remote model's worker sends upstream, with its Piper worker."""
    from webapp.tenants.services import OPERATOR, create_api_key

    org = make_org("upstream-tenant")
    _, raw = create_api_key(org, "remote engine", created_by=OPERATOR, scopes=["speech:read", "speech:write"])
    return org, raw


@pytest.fixture
def loopback(
    stack: TestStack, upstream_tenant: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    with tcp_gunicorn(stack, "web-upstream") as port:
        path = tmp_path / "remote-models.json"
        model = {
            "upstreams": [f"http://127.0.0.1:{port}"],
            "upstream_model": "tts-1",
            "voices": [{"id": "alloy", "language": "en-us", "name": "Alloy (Piper, through the service)"}],
            "sample_rate": 24000,
            "api_key_env": "TTS_REMOTE_LOOPBACK_KEY",
            "read_timeout_seconds": 30,
        }
        path.write_text(json.dumps({"models": {MODEL: model}}))
        monkeypatch.setenv("TTS_REMOTE_MODELS_FILE", str(path))
        worker = start_worker(
            stack,
            "remote-loopback",
            engines=MODEL,
            TTS_REMOTE_MODELS_FILE=str(path),
            TTS_REMOTE_LOOPBACK_KEY=upstream_tenant[1],
        )
        try:
            yield
        finally:
            stack.stop_service(worker)


def test_this_service_is_the_upstream_of_a_remote_model(
    loopback: None, upstream_tenant: tuple[Any, str]
) -> None:
    from synth.registry import list_voices
    from webapp.speech.models import SynthesisJob
    from webapp.speech.voices import sync_builtin_voices

    sync_builtin_voices(list_voices(engines=[MODEL]))
    job = submit(make_org("downstream-tenant"), TEXT, voice=f"{MODEL}:alloy")
    (row,) = wait_status([job.id], timeout=90)
    assert row.status == "succeeded", (row.error_code, row.error_message)
    assert row.metrics["audio_seconds"] > 2.0
    # Upstream, each sentence was a /v1/audio/speech job of the key's tenant, spoken by Piper.
    spoken = list(
        SynthesisJob.objects.filter(organization=upstream_tenant[0], source="openai").values_list(
            "text", "engine", "status"
        )
    )
    assert {text for text, _, _ in spoken} >= {
        "A remote model speaks here.",
        "Its upstream is this very service.",
    }
    assert {engine for _, engine, _ in spoken} == {"piper"} and {s for _, _, s in spoken} == {"succeeded"}
