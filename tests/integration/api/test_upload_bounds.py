"""Issue 31, finding 1: voice uploads are rate-limited per tenant on both paths, and their decodes
wait in one bounded host-wide queue (429/503 with Retry-After, problem+json on the API); a slot
whose holder was killed comes back by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from tests import prompt_files as pf
from tests.integration.api.conftest import Tenant, problem
from webapp.speech.services import decodes

URL = "/api/v1/voices"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bounded-uploads")
    audio, rate = pf.speech(tmp)
    return pf.write(tmp / "five.wav", audio[: rate * 5], rate)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pf.renamed_text_file(tmp_path_factory.mktemp("refused") / "notes.wav")


@pytest.fixture(autouse=True)
def empty_host_queue(stack: Any) -> Iterator[None]:
    """No slot of another test (or a killed holder) on this host when a test starts or ends."""
    client = stack.redis_client()
    keys = [decodes.queue_key(decodes.host()), decodes.slots_key(decodes.host())]
    client.delete(*keys)
    yield
    client.delete(*keys)


def api_upload(tenant: Tenant, path: Path) -> Any:
    with open(path, "rb") as fh:
        data = {"name": "Voice", "consent": "true", "audio": fh}
        return tenant.client.client.post(URL, data, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")


def held_by_another_process(organization_id: Any, **env: str) -> subprocess.Popen[str]:
    """A process of its own (as another web process would be) holding a decode slot until killed."""
    code = (
        "import django, sys, time; django.setup()\n"
        "from webapp.speech.services import decodes\n"
        f"decodes.MARGIN_SECONDS = {decodes.MARGIN_SECONDS!r}\n"
        f"held = decodes.decode_slot({str(organization_id)!r}); held.__enter__()\n"
        "print('held', flush=True); time.sleep(120)\n"
    )
    child_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env}
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=child_env, cwd=os.getcwd()
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


@override_settings(TTS_VOICE_UPLOADS_PER_MINUTE=2)
def test_the_api_counts_every_upload_refused_ones_too_then_429(
    make_tenant: Callable[..., Tenant], text_file: Path, good: Path
) -> None:
    tenant = make_tenant()
    assert [api_upload(tenant, text_file).status_code for _ in range(2)] == [415, 415]
    answer = api_upload(tenant, good)
    body = problem(answer)
    assert answer.status_code == 429 and body["code"] == "rate_limited", body
    assert 1 <= int(answer["Retry-After"]) <= 60
    assert "voice uploads" in body["detail"]
    # Another tenant's budget is its own.
    assert api_upload(make_tenant(), good).status_code == 202


@override_settings(TTS_PROMPT_DECODES_PER_TENANT=1)
def test_a_tenant_with_an_upload_in_progress_gets_429_too_many_uploads(
    make_tenant: Callable[..., Tenant], good: Path
) -> None:
    tenant = make_tenant()
    with decodes.decode_slot(tenant.org.pk):
        answer = api_upload(tenant, good)
        body = problem(answer)
        assert answer.status_code == 429 and body["code"] == "too_many_uploads", body
        assert int(answer["Retry-After"]) >= 1
        # Another tenant is not held back by this one's upload.
        assert api_upload(make_tenant(), good).status_code == 202
    assert api_upload(tenant, good).status_code == 202


@override_settings(
    TTS_PROMPT_DECODES_PER_HOST=1, TTS_PROMPT_DECODE_QUEUE=1, TTS_PROMPT_DECODE_WAIT_SECONDS=1.0
)
def test_a_full_host_queue_answers_503_and_no_upload_waits_past_the_bound(
    make_tenant: Callable[..., Tenant], good: Path
) -> None:
    tenant = make_tenant()
    with decodes.decode_slot(make_tenant().org.pk):  # the host's one decoder is busy
        started = time.monotonic()
        answer = api_upload(tenant, good)  # waits in the queue, in vain
        waited = time.monotonic() - started
        body = problem(answer)
        assert answer.status_code == 503 and body["code"] == "decoder_busy", body
        assert answer["Retry-After"] == "1"
        assert 0.9 <= waited < 4.0, waited
        # The queue's one place taken (another upload waiting): refused at once.
        decodes._enter(make_tenant().org.pk, decodes.host(), "waiting-elsewhere")
        started = time.monotonic()
        answer = api_upload(tenant, good)
        assert answer.status_code == 503 and problem(answer)["code"] == "decoder_busy"
        assert time.monotonic() - started < 0.9
    assert decodes.in_use(tenant.org.pk)["tenant"] == 0  # a refused upload leaves no slot behind


@override_settings(TTS_PROMPT_DECODES_PER_HOST=1, TTS_PROMPT_DECODE_QUEUE=0)
def test_the_slot_of_a_killed_holder_comes_back(
    make_tenant: Callable[..., Tenant], good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decodes, "MARGIN_SECONDS", 1)
    tenant = make_tenant()
    holder = held_by_another_process(make_tenant().org.pk, TTS_PROMPT_DECODE_TIMEOUT_SECONDS="1")
    killed_at = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    assert decodes.in_use()["decoding"] == 1  # the killed process never gave its slot back
    assert api_upload(tenant, good).status_code == 503
    # Its slot lives for the decode's timeout plus the margin (2 s here), then it is free again.
    deadline = killed_at + 10
    while (status := api_upload(tenant, good).status_code) == 503 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert status == 202
    assert time.monotonic() - killed_at < 10
