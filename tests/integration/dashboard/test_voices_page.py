"""The Voices page: uploads go through the API's upload service, with its limits, and roles decide."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests import prompt_files as pf
from tests.dashboard_data import member_of
from tests.integration.dashboard.conftest import client_for
from webapp.dashboard.forms import CONSENT_TEXT
from webapp.speech.models import Voice


@pytest.fixture(scope="module")
def good_prompt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 5 s of real speech (flite's slt), cut to 5 s."""
    tmp = tmp_path_factory.mktemp("dashboard-prompts")
    audio, rate = pf.speech(tmp)
    return pf.write(tmp / "five.wav", audio[: rate * 5], rate)


def upload(client: Any, path: Path, **fields: str) -> Any:
    with open(path, "rb") as fh:
        data = {"name": "Narrator", "transcript": "", "consent": "on", "audio": fh, **fields}
        return client.post("/app/voices/upload/", data)


def field_errors(page: str, field: str) -> str:
    """The text of the field's block (errors are shown next to the field)."""
    blocks = re.findall(r'<div class="field has-error">.*?</div>', page, re.S)
    block = next((b for b in blocks if f'id="id_{field}"' in b), None)
    assert block is not None, f"no error next to {field}"
    return block


def test_an_upload_is_listed_processing_with_its_mode(owner: tuple[Any, Any], good_prompt: Path) -> None:
    client = client_for(owner[0])
    page = client.get("/app/voices/").content.decode()
    assert CONSENT_TEXT in page and "unavailable on this install" in page
    answer = upload(client, good_prompt, transcript=pf.PROMPT_SENTENCE)
    assert answer.status_code == 302 and answer.url == "/app/voices/"
    voice = Voice.objects.get(organization=owner[1])
    assert voice.status == Voice.Status.PROCESSING and voice.cloning_mode == "approximate"
    assert voice.consent_by == owner[0] and voice.consent_by_label == "owner@example.com"
    listing = client.get("/app/voices/").content.decode()
    row = re.search(rf'<tr data-voice="{voice.voice_id}".*?</tr>', listing, re.S)
    assert row is not None
    assert "processing" in row.group(0) and "closest voice" in row.group(0)


def test_a_refused_file_shows_its_error_next_to_the_field(owner: tuple[Any, Any], tmp_path: Path) -> None:
    answer = upload(client_for(owner[0]), pf.renamed_text_file(tmp_path / "notes.wav"))
    assert answer.status_code == 400
    assert 'class="error"' in field_errors(answer.content.decode(), "audio")
    assert "not audio in a supported format" in field_errors(answer.content.decode(), "audio")
    assert not Voice.objects.filter(organization=owner[1]).exists()


def test_an_upload_without_consent_is_refused_at_the_checkbox(
    owner: tuple[Any, Any], good_prompt: Path
) -> None:
    answer = upload(client_for(owner[0]), good_prompt, consent="")
    assert answer.status_code == 400
    assert "permission" in field_errors(answer.content.decode(), "consent")
    assert not Voice.objects.filter(organization=owner[1]).exists()


def test_a_rejected_voice_shows_its_reason_and_can_be_deleted(
    owner: tuple[Any, Any], good_prompt: Path
) -> None:
    client = client_for(owner[0])
    upload(client, good_prompt)
    voice = Voice.objects.get(organization=owner[1])
    Voice.objects.filter(pk=voice.pk).update(
        status=Voice.Status.REJECTED, status_reason="the recording is mostly silence"
    )
    assert "rejected: the recording is mostly silence" in client.get("/app/voices/").content.decode()
    client.post(f"/app/voices/{voice.pk}/delete/")
    assert not Voice.objects.filter(pk=voice.pk).exists()


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_roles_without_voices_write_cannot_upload_or_delete(
    owner: tuple[Any, Any], good_prompt: Path, role: str
) -> None:
    upload(client_for(owner[0]), good_prompt)
    voice = Voice.objects.get(organization=owner[1])
    client = client_for(member_of(owner[1], f"{role}@example.com", role))
    page = client.get("/app/voices/").content.decode()
    assert voice.voice_id in page and 'id="voice-upload"' not in page
    assert upload(client, good_prompt, name="Mine").status_code == 403
    assert client.post(f"/app/voices/{voice.pk}/delete/").status_code == 403
    assert list(Voice.objects.filter(organization=owner[1])) == [voice]
