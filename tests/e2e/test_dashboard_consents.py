"""Voice consents in a real browser: the microphone is Chromium's fake device fed from real speech.

Chromium -> Nginx (TLS) -> gunicorn, with ``--use-file-for-fake-audio-capture``: the fake
microphone plays a WAV that flite renders (a real recording of synthetic speech), the page's
MediaRecorder makes WebM/Opus of it, and the server decodes and recognises that as it would a
person's. Chromium opens the file when a page starts capturing, not at launch, so the test
writes the phrase's reading after the page shows the phrase (its code is random) and before
it presses Record; ``%noloop`` plays it once, then silence.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from tests import prompt_files as pf
from tests.dashboard_data import make_owner
from tests.e2e.dashboard_browser import BASE, CHROMIUM, CHROMIUM_ARGS, check_page, new_context, wait_until

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WAV the fake microphone plays: written by each test before it records."""
    return tmp_path_factory.mktemp("microphone") / "microphone.wav"


@pytest.fixture(scope="module")
def mic_browser(microphone: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    fake_microphone = [
        "--use-fake-ui-for-media-stream",  # the permission prompt answers yes
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}%noloop",
    ]
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + fake_microphone)
        yield chromium
        chromium.close()


@pytest.fixture
def page(mic_browser: Any, web: Any, transactional_db: None) -> Iterator[Any]:
    """A signed-in owner's page (no login POST: Nginx's strict zone is for people, not for set-up)."""
    from django.test import Client

    owner, _ = make_owner()
    client = Client()
    client.force_login(owner)
    ctx = new_context(mic_browser)
    ctx.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": BASE}])
    yield ctx.new_page()
    ctx.close()


def speak(microphone: Path, text: str) -> float:
    """What the fake microphone plays next: ``text`` read by flite's slt; its length in seconds."""
    pf.read_aloud("slt", microphone, text)
    return float(sf.info(str(microphone)).duration)


def focused(page: Any) -> str:
    """The focused element, as a selector-ish word: its id or its recorder data attribute."""
    return str(
        page.evaluate(
            "() => { const e = document.activeElement; return e.id || "
            "['data-record', 'data-stop', 'data-play'].find((a) => e.hasAttribute(a)) || e.tagName; }"
        )
    )


def record_by_keyboard(page: Any, recorder: str, seconds: float) -> float:
    """Record ``seconds`` from the focused Record button with Enter only, stop, play back; the
    decoded length of the recording."""
    root = page.locator(f"#{recorder}-recorder")
    assert focused(page) == "data-record"
    page.keyboard.press("Enter")
    wait_until(lambda: root.get_attribute("data-state") == "recording", 10, "recording")
    time.sleep(seconds + 0.8)
    assert focused(page) == "data-stop"  # Record is disabled while recording: focus moved on
    page.keyboard.press("Enter")
    wait_until(lambda: root.get_attribute("data-state") == "recorded", 10, "the recording")
    duration = wait_until(
        lambda: root.locator("audio").get_attribute("data-decoded-duration"), 10, "the decoded recording"
    )
    assert focused(page) == "data-play"
    page.keyboard.press("Enter")
    wait_until(
        lambda: root.locator("audio").evaluate("(a) => !a.paused || a.currentTime > 0"), 10, "the playback"
    )
    return float(duration)


def test_record_a_consent_then_a_voice_naming_it_then_revoke_it(page: Any, microphone: Path) -> None:
    from webapp.speech.models import ConsentPhrase, Voice, VoiceConsent

    page.goto("/app/voices/consents/")
    page.fill("#name", "Ann")
    page.select_option("#language", "en")
    page.focus("#get-phrase")
    page.keyboard.press("Enter")
    page.wait_for_selector("#phrase-box:not([hidden])")
    text = page.locator("#phrase-text").inner_text()
    code = page.locator("#phrase-code").inner_text()
    assert ConsentPhrase.objects.get(code=code).text == text and " ".join(code) in text
    assert page.locator("#phrase-expiry").get_attribute("datetime")
    check_page(page, "consents-phrase")

    # Another code read: the server's message, and the phrase stays to be read again.
    wrong = "".join(str((int(c) + 5) % 10) for c in code)
    seconds = speak(microphone, text.replace(" ".join(code), " ".join(wrong)))
    page.keyboard.press("Tab")  # from the phrase (focused when shown) to Record
    assert record_by_keyboard(page, "consent", seconds) > seconds - 0.5
    page.click("#consent-submit")
    error = page.locator("#recording-error")
    error.wait_for(state="visible", timeout=30_000)
    assert "We heard another code" in error.inner_text()
    assert not VoiceConsent.objects.exists()

    seconds = speak(microphone, text)
    page.focus("#consent-recorder [data-record]")
    record_by_keyboard(page, "consent", seconds)
    page.click("#consent-submit")
    page.wait_for_selector("p.msg.success", timeout=30_000)  # the list again, with a message
    consent = VoiceConsent.objects.get(name="Ann")
    row = page.locator(f'tr[data-consent="{consent.consent_id}"]')
    assert row.get_attribute("data-status") == "active" and "owner@example.com" in row.inner_text()
    assert consent.heard_code == code
    check_page(page, "consents-recorded")

    # A voice recorded from the microphone, naming the consent.
    seconds = speak(microphone, pf.PROMPT_SENTENCE)
    page.goto("/app/voices/")
    page.get_by_label("Name", exact=True).fill("Ann's voice")
    page.focus("#prompt-recorder [data-record]")
    assert record_by_keyboard(page, "prompt", seconds) > 3
    assert page.locator("#id_audio").evaluate("(input) => input.files.length") == 1
    page.select_option("#id_recorded_consent", consent.consent_id)
    check_page(page, "voices-recorded")
    page.get_by_role("button", name="Upload").click()
    voice_row = page.locator("#own-voice-list tr", has_text="Ann's voice")
    assert consent.consent_id in voice_row.inner_text()
    voice = Voice.objects.get(name="Ann's voice")
    assert voice.consent_id == consent.pk and voice.prompt_stats["container"] == "webm"

    page.goto("/app/voices/consents/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke the consent of Ann").click()
    page.wait_for_selector(f'tr[data-consent="{consent.consent_id}"][data-status="revoked"]')
    consent.refresh_from_db()
    assert consent.status == VoiceConsent.Status.REVOKED
