"""The dashboard in a real browser: Debian's chromium -> Nginx (TLS) -> gunicorn -> a real worker.

Each test also screenshots the pages it visits (var/test/screenshots/) and runs
axe-core on them: no serious or critical violations.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.dashboard_data import PASSWORD, make_job, make_owner
from tests.e2e.dashboard_browser import (
    BASE,
    check_page,
    csp_violations,
    mail_files,
    new_context,
    wait_for_link,
    wait_until,
)

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests
# make for set-up are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

SENTENCES = " ".join(
    f"This is sentence number {n}, and it carries a few more words so that each one takes a moment to speak."
    for n in range(1, 21)
)


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    ctx = new_context(browser)
    yield ctx
    ctx.close()


@pytest.fixture
def stack_ready(web: Any, synth_worker: Any, builtin_voices: list[str], transactional_db: None) -> Any:
    """Nginx, gunicorn and a worker up, voices in the database, and the hourly budgets (sign-ups,
    invitations, account mails) reset."""
    r = web.redis_client()
    for key in r.scan_iter(match="*hourly:*"):
        r.delete(key)
    return web


def log_in(context: Any, user: Any) -> Any:
    """A signed-in browser without a login POST (Nginx's strict zone is for people, not for set-up)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": BASE}])
    return context.new_page()


def api(key: str) -> requests.Session:
    session = requests.Session()
    session.verify = False
    session.trust_env = False
    session.headers["Authorization"] = f"Bearer {key}"
    return session


def submit_text(page: Any, text: str) -> None:
    page.goto("/app/synthesize/")
    page.fill("#text", text)
    page.click("#submit")
    page.wait_for_selector("#job:not([hidden])")


def test_sign_up_synthesize_and_see_usage_go_up(stack_ready: Any, context: Any) -> None:
    page = context.new_page()
    page.goto("/")
    assert page.get_by_role("link", name="Sign up").is_visible()
    check_page(page, "home")
    page.click("text=Sign up")
    check_page(page, "signup")
    before = mail_files()
    page.fill("#id_email", "new.person@example.com")
    page.fill("#id_organization", "New Co")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/app/account/")
    check_page(page, "account-unverified")
    page.goto("/app/synthesize/")
    assert "/app/account/" in page.url  # no synthesis before the address is confirmed
    link = wait_for_link(before, "new.person@example.com", r"https?://\S+/accounts/verify/\S+/")
    page.goto(link)
    page.wait_for_url("**/app/synthesize/")

    page.goto("/app/usage/")
    used_before = int(page.locator("#characters-used strong").inner_text().replace(",", ""))
    page.goto("/app/synthesize/")
    check_page(page, "synthesize")
    page.fill("#text", SENTENCES)
    assert page.locator("#char-count").inner_text() == f"{len(SENTENCES):,}"
    page.click("#submit")
    page.wait_for_selector("#job[data-status=succeeded]", timeout=120_000)
    seen = set(page.locator("#progress").get_attribute("data-seen").split())
    assert len(seen) >= 3, f"progress values seen: {seen}"
    duration = wait_until(
        lambda: page.locator("#player").get_attribute("data-decoded-duration"), 20, "decoded audio"
    )
    assert float(duration) > 10
    assert page.locator("#download").get_attribute("href").endswith("?download=1")
    check_page(page, "synthesize-done")

    page.goto("/app/usage/")
    used_after = int(page.locator("#characters-used strong").inner_text().replace(",", ""))
    assert used_after >= used_before + len(SENTENCES) - 20
    check_page(page, "usage")
    page.goto("/app/history/")
    assert page.locator("tbody tr").count() == 1
    check_page(page, "history")

    page.goto("/app/synthesize/")
    page.fill("#text", "Say [h][ao please")
    page.click("#submit")
    page.wait_for_selector("#text-error:not([hidden])")
    assert "unclosed '['" in page.locator("#text-error").inner_text()
    assert page.locator("#text-excerpt mark").inner_text() == "["
    assert page.locator("#text").get_attribute("aria-invalid") == "true"
    check_page(page, "synthesize-annotation-error")
    page.click("#preview")
    preview = wait_until(
        lambda: page.locator("#preview-audio").get_attribute("data-decoded-duration"), 60, "a voice preview"
    )
    assert float(preview) > 0.5


def test_a_long_job_can_be_canceled(stack_ready: Any, context: Any) -> None:
    user, _ = make_owner()
    page = log_in(context, user)
    submit_text(page, " ".join([SENTENCES] * 2))
    page.wait_for_selector("#job[data-status=running]", timeout=60_000)
    page.click("#cancel")
    page.wait_for_selector("#job[data-status=canceled]", timeout=60_000)
    assert "Canceled" in page.locator("#job-status").inner_text()
    page.goto("/app/history/?status=canceled")
    assert page.locator("tbody tr").count() == 1


def test_a_key_is_shown_once_works_and_stops_working_when_revoked(stack_ready: Any, context: Any) -> None:
    user, _ = make_owner()
    page = log_in(context, user)
    page.goto("/app/keys/")
    check_page(page, "keys")
    page.fill("#id_name", "laptop")
    page.click("button:has-text('Create key')")
    raw = page.locator("#new-key").inner_text().strip()
    assert re.fullmatch(r"tts_[A-Za-z0-9]{8}_[A-Za-z0-9_-]+", raw)
    assert raw in page.locator("#snippet-curl").inner_text()
    assert raw in page.locator("#snippet-openai").inner_text()
    check_page(page, "keys-new")
    assert api(raw).get(f"{BASE}/api/v1/voices", timeout=30).status_code == 200

    page.goto("/app/keys/")
    assert raw not in page.content()  # shown once, never again
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Revoke')")
    page.wait_for_selector("text=is revoked")
    assert wait_until(
        lambda: api(raw).get(f"{BASE}/api/v1/voices", timeout=30).status_code == 401, 10, "the key refused"
    )


def test_an_invited_member_sees_history_but_cannot_manage_keys(
    stack_ready: Any, context: Any, browser: Any
) -> None:
    owner, org = make_owner()
    make_job(org, owner, "The owner's job.", progress=1.0)
    page = log_in(context, owner)
    page.goto("/app/members/")
    check_page(page, "members")
    before = mail_files()
    page.fill("#id_email", "member@example.com")
    page.select_option("#id_role", "member")
    page.click("button:has-text('Invite')")
    page.wait_for_selector("tr[data-invitation='member@example.com']")

    # No account until the invited person follows the link and chooses a password there.
    link = wait_for_link(before, "member@example.com", r"https?://\S+/accounts/invitation/\S+/")
    member_context = new_context(browser)
    try:
        member = member_context.new_page()
        member.goto(link)
        check_page(member, "invitation")
        member.fill("#id_new_password1", PASSWORD)
        member.fill("#id_new_password2", PASSWORD)
        member.click("button[type=submit]")
        member.wait_for_url("**/app/synthesize/")
        member.goto("/app/history/")
        assert "The owner's job." in member.locator("tbody").inner_text()
        assert member.get_by_role("link", name="API keys").count() == 0
        response = member.goto("/app/keys/")
        assert response is not None and response.status == 403
        check_page(member, "forbidden")
    finally:
        member_context.close()


def test_script_in_text_and_voice_name_is_shown_as_text(
    stack_ready: Any, context: Any, tmp_path: Any
) -> None:
    from webapp.speech.models import Voice

    owner, org = make_owner()
    evil = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
    Voice.objects.create(
        voice_id="acme-evil", organization=org, name=evil, engine="piper", language="en", sample_rate=22050
    )
    make_job(
        org, owner, evil, status="failed", voice_name="acme-evil", error_code="job_failed", error_message=evil
    )
    page = log_in(context, owner)
    for path in ("/app/history/", "/app/voices/", "/app/synthesize/"):
        page.goto(path)
        assert page.evaluate("() => window.__pwned") is None
        assert page.locator("script:not([src])").count() == 0
    page.goto("/app/voices/")
    assert "<script>window.__pwned = 1</script>" in page.locator("main").inner_text()
    check_page(page, "voices")
    _upload_a_voice(page, tmp_path)


def _upload_a_voice(page: Any, tmp_path: Any) -> None:
    from tests import prompt_files as pf

    audio, rate = pf.speech(tmp_path)
    page.get_by_label("Name", exact=True).fill("Narrator")
    prompt = pf.write(tmp_path / "five.wav", audio[: rate * 5], rate)
    page.get_by_label("Recording", exact=True).set_input_files(str(prompt))
    page.get_by_label("I confirm").check()
    page.get_by_role("button", name="Upload").click()
    row = page.locator("#own-voice-list tr", has_text="Narrator")
    assert "processing" in row.inner_text() and "closest voice" in row.inner_text()


def _totp(secret: str, step_ahead: int = 0) -> str:
    """The code of the secret's authenticator; ``step_ahead`` 1 is the next 30 s step's code,
    which django-otp accepts (tolerance 1) even though the current step was just used."""
    import base64

    from django_otp.oath import totp

    key = base64.b32decode(secret + "=" * (-len(secret) % 8))
    return f"{totp(key, drift=step_ahead):06d}"


def test_enrol_totp_then_log_in_with_a_code(stack_ready: Any, context: Any) -> None:
    owner, _ = make_owner()
    page = log_in(context, owner)
    page.goto("/app/account/security/")
    check_page(page, "security")
    secret = page.locator("#totp-secret").inner_text().strip()
    page.fill("#id_code", _totp(secret))
    page.fill("#id_password", PASSWORD)  # a session alone cannot add a second factor
    page.click("button:has-text('Turn on')")
    assert page.locator("#recovery-codes li").count() == 10
    check_page(page, "security-recovery-codes")
    page.goto("/app/account/security/")
    assert page.locator("#recovery-codes").count() == 0  # shown once

    page.click("button:has-text('Log out')")
    page.goto("/accounts/login/")
    check_page(page, "login")
    page.fill("#id_username", owner.email)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/accounts/login/code/**")
    page.goto("/app/usage/")
    assert "/accounts/login/" in page.url  # the password alone does not sign in
    page.goto("/accounts/login/code/")
    check_page(page, "login-code")
    page.fill("#id_code", _totp(secret, step_ahead=1))
    page.click("button[type=submit]")
    page.wait_for_url("**/app/synthesize/")
    assert page.get_by_role("button", name="Log out").is_visible()


def test_every_page_passes_axe_in_dark_mode_and_works_from_the_keyboard(
    stack_ready: Any, browser: Any
) -> None:
    owner, org = make_owner()
    make_job(org, owner, "A running job.", status="running", progress=0.4)
    dark = new_context(browser, color_scheme="dark")
    try:
        page = dark.new_page()
        for path, name in (("/", "home"), ("/accounts/login/", "login"), ("/accounts/signup/", "signup")):
            page.goto(path)
            check_page(page, f"dark-{name}")
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"

        before = mail_files()
        page.goto("/accounts/password/reset/")
        check_page(page, "dark-password-reset")
        page.fill("#id_email", owner.email)
        page.keyboard.press("Enter")  # submits the form without the mouse
        page.wait_for_url("**/accounts/password/reset/sent/")
        check_page(page, "dark-password-reset-sent")
        page.goto(wait_for_link(before, owner.email, r"https?://\S+/accounts/password/set/\S+/"))
        check_page(page, "dark-password-set")
        page.fill("#id_new_password1", PASSWORD + "x")
        page.fill("#id_new_password2", PASSWORD + "x")
        page.click("button[type=submit]")
        page.wait_for_url("**/accounts/password/done/")
        check_page(page, "dark-password-done")

        owner.refresh_from_db()  # the new password hash, or the session made below is refused
        page = log_in(dark, owner)
        for path in (
            "synthesize",
            "history",
            "voices",
            "voices/consents",
            "keys",
            "usage",
            "members",
            "account",
            "account/security",
        ):
            page.goto(f"/app/{path}/")
            assert page.url.endswith(f"/app/{path}/")
            check_page(page, "dark-" + path.replace("/", "-"))
        page.goto("/app/history/")
        assert page.locator("tr[data-running] progress").get_attribute("value") == "40"
        page.set_viewport_size({"width": 360, "height": 740})  # a phone: nothing wider than the screen
        for path in ("/app/synthesize/", "/app/keys/", "/"):
            page.goto(path)
            assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"), path
        check_page(page, "phone-synthesize")
    finally:
        dark.close()


def test_the_api_reference_renders_under_its_own_policy(stack_ready: Any, context: Any) -> None:
    """/api/docs is the one page whose policy allows inline styles: Redoc writes them at run time."""
    page = context.new_page()
    page.goto("/api/docs")
    page.locator("h1").first.wait_for()  # Redoc rendered the schema's title
    assert page.locator("h1").first.inner_text().strip()
    assert page.evaluate("() => document.querySelectorAll('style').length") > 0  # its run-time styles
    # Nothing refused but Redoc's "powered by" logo from its CDN, which the page must not load.
    refused = [v for v in csp_violations(page) if not v.startswith("img-src blocked https://cdn.redoc.ly/")]
    assert refused == [], refused
