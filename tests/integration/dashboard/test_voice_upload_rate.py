"""Issue 31, finding 1: an upload from the Voices page counts against the tenant's upload rate (as
the API's does: refused ones too) and against its request rate (as the page's submit does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from tests import prompt_files as pf
from tests.dashboard_data import make_owner
from tests.integration.dashboard.conftest import client_for
from webapp.speech.models import Voice


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("page-uploads")
    audio, rate = pf.speech(tmp)
    return pf.write(tmp / "five.wav", audio[: rate * 5], rate)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pf.renamed_text_file(tmp_path_factory.mktemp("page-refused") / "notes.wav")


def page_upload(client: Any, path: Path) -> Any:
    with open(path, "rb") as fh:
        data = {"name": "Narrator", "transcript": "", "consent": "on", "audio": fh}
        return client.post("/app/voices/upload/", data)


@override_settings(TTS_VOICE_UPLOADS_PER_MINUTE=2)
def test_the_dashboard_counts_uploads_against_the_same_rate(db: None, text_file: Path, good: Path) -> None:
    user, org = make_owner(email="uploader@example.com", organization="Uploads")
    client = client_for(user)
    assert [page_upload(client, text_file).status_code for _ in range(2)] == [400, 400]
    answer = page_upload(client, good)
    assert answer.status_code == 429
    assert 1 <= int(answer["Retry-After"]) <= 60
    assert "voice uploads in a minute" in answer.content.decode()
    assert not Voice.objects.filter(organization=org).exists()


def test_the_dashboard_upload_counts_against_the_tenants_request_rate(db: None, good: Path) -> None:
    from webapp.tenants.models import Plan

    user, org = make_owner(email="rate@example.com", organization="Rate")
    org.plan = Plan.objects.create(slug="one-a-minute", name="One a minute", requests_per_minute=1)
    org.save()
    client = client_for(user)
    assert page_upload(client, good).status_code == 302
    answer = page_upload(client, good)
    assert answer.status_code == 429 and int(answer["Retry-After"]) >= 1
    assert Voice.objects.filter(organization=org).count() == 1
