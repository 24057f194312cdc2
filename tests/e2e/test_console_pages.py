"""Issue 35's pages in Chromium through Nginx: the admin's one-pass sign-in, the invite-only front door,
the quota, the usage explorer, keys and history; axe-core on each page, the keyboard alone where it matters.

One browser and one extra gunicorn for the whole module: the gunicorn runs with
the production choices these pages depend on (the admin asks for the TOTP code,
sign-up by invitation with an operator's contact line), behind an Nginx of its
own from the project template; the session's web stack is left as it is.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from deploy import stack as deploy_stack
from deploy.stack import Service
from tests.e2e.dashboard_browser import CSP_WATCH, check_page
from tests.e2e.nginx_helpers import NginxInstance, start_nginx
from tests.stack import CFG, side_gunicorn_env
from tests.stack import TestStack as Stack

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

CONTACT = "accounts@example.com"
CONSOLE_ENV = {
    "TTS_ADMIN_REQUIRE_OTP": "1",
    "TTS_SIGNUP": "invite",
    "TTS_SIGNUP_CONTACT": CONTACT,
    "TTS_GUNICORN_WORKERS": "1",
}


@pytest.fixture(scope="module")
def edge(web: Stack) -> Iterator[NginxInstance]:
    """A gunicorn with CONSOLE_ENV on a socket of its own, and an Nginx in front of it."""
    sock = CFG.path("run", "gunicorn-console.sock")
    sock.unlink(missing_ok=True)
    command = deploy_stack.gunicorn_command(CFG)
    command[command.index("--bind") + 1] = f"unix:{sock}"
    command[command.index("--control-socket") + 1] = str(CFG.path("run", "gunicorn-console.ctl"))
    gunicorn = web.start_service(
        Service("gunicorn-console", command, env=side_gunicorn_env("gunicorn-console", **CONSOLE_ENV))
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline, "the console's gunicorn made no socket"
            time.sleep(0.1)
        nginx = start_nginx(web, "nginx-console", overrides={"UPSTREAM": f"unix:{sock}"})
        try:
            yield nginx
        finally:
            web.stop_service(nginx.service)
    finally:
        web.stop_service(gunicorn)


@pytest.fixture
def context(browser: Any, edge: NginxInstance, transactional_db: None) -> Iterator[Any]:
    ctx = browser.new_context(ignore_https_errors=True, base_url=edge.base)
    ctx.add_init_script(CSP_WATCH)
    ctx.set_default_timeout(20_000)
    yield ctx
    ctx.close()


def signed_in(context: Any, edge: NginxInstance, user: Any) -> Any:
    """A signed-in page without a login POST (Nginx's strict login zone is for people, not set-up)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": edge.base}])
    return context.new_page()


def _printed(output: str, label: str) -> str:
    match = re.search(rf"^\s+{re.escape(label)}\s+(\S+)\s*$", output, re.MULTILINE)
    assert match, f"no {label} in {output!r}"
    return match.group(1)


def _code_now(otpauth: str) -> str:
    from base64 import b32decode

    from django_otp.oath import totp

    secret = parse_qs(urlparse(otpauth).query)["secret"][0]
    key = b32decode(secret + "=" * (-len(secret) % 8))
    return str(totp(key)).zfill(6)


def test_it_signs_the_printed_admin_in_with_password_and_code_in_one_try(context: Any) -> None:
    from django.core.management import call_command
    from django.test import override_settings

    out = StringIO()
    with override_settings(TTS_ADMIN_REQUIRE_OTP=True):
        call_command("bootstrap_demo", stdout=out)
    password, otpauth = _printed(out.getvalue(), "password"), _printed(out.getvalue(), "TOTP (admin)")
    page = context.new_page()
    page.goto("/admin/login/?next=/admin/")
    assert page.locator("select").count() == 0  # no device to pick
    check_page(page, "admin-login")
    # The keyboard alone: the user name field has the focus, Tab moves on, Enter submits.
    page.focus("#id_username")
    page.keyboard.type("admin")
    page.keyboard.press("Tab")
    page.keyboard.type(password)
    page.keyboard.press("Tab")
    page.keyboard.type(_code_now(otpauth))
    page.keyboard.press("Enter")
    page.wait_for_url(lambda url: urlparse(url).path == "/admin/")
    assert page.get_by_role("heading", name="Operations").is_visible()


def test_it_tells_a_newcomer_that_accounts_are_by_invitation_and_whom_to_ask(context: Any) -> None:
    page = context.new_page()
    page.goto("/")
    notice = page.locator("#invitation-only")
    assert "by invitation" in notice.inner_text() and CONTACT in notice.inner_text()
    assert page.get_by_role("link", name=CONTACT).get_attribute("href") == f"mailto:{CONTACT}"
    assert page.get_by_role("link", name="Sign up").count() == 0
    assert page.get_by_role("link", name="API documentation").first.get_attribute("href") == "/api/docs"
    check_page(page, "home-invite-only")
    page.goto("/accounts/signup/")
    assert CONTACT in page.locator("#invitation-only").inner_text()
    check_page(page, "signup-invite-only")


@pytest.fixture
def busy_tenant(context: Any) -> dict[str, Any]:
    """An owner whose tenant used 85 % of a small plan through two keys, two voices and three sources."""
    from tests.dashboard_data import make_job, make_owner
    from tests.usage_data import billed_job
    from webapp.tenants.models import Plan
    from webapp.tenants.services import create_api_key

    user, org = make_owner("console.owner@example.com", "Console Co")
    org.plan = Plan.objects.create(slug="console-small", name="Small", monthly_characters=10_000)
    org.save()
    key_a, _ = create_api_key(org, "backend", created_by=user)
    key_b, _ = create_api_key(org, "@batch", created_by=user)
    billed_job(org, 4_000, user=user, key=key_a, source="api")
    billed_job(org, 3_000, user=user, key=key_b, voice="en_US-amy-medium", source="openai")
    billed_job(org, 1_500, user=user, source="dashboard")
    make_job(org, user, "Please read the quarterly report aloud.", params={"speed": 1.5})
    return {"user": user, "org": org}


def test_it_explores_usage_and_downloads_what_it_shows_with_the_keyboard(
    context: Any, edge: NginxInstance, busy_tenant: dict[str, Any]
) -> None:
    page = signed_in(context, edge, busy_tenant["user"])
    page.goto("/app/usage/")
    assert "85 % of this month's characters are used" in page.locator("#quota-banner").inner_text()
    assert page.locator("#characters-left strong").inner_text() == "1,500"
    check_page(page, "usage-explorer")
    page.focus("#usage-group")
    page.keyboard.press("ArrowDown")  # Day -> API key
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # the Show button
    page.wait_for_url("**group_by=key**")
    cells = page.locator("#usage-table tbody tr").all_inner_texts()
    shown = [line.split("\t") for line in cells]
    assert {row[0].split(" (")[0] for row in shown} == {"backend", "@batch", "no key"}
    check_page(page, "usage-by-key")
    with page.expect_download() as download:
        page.focus("#usage-csv")
        page.keyboard.press("Enter")
    text = open(download.value.path(), encoding="utf-8").read()
    lines = [line.split(",") for line in text.strip().splitlines()]
    assert lines[0] == ["API key", "Characters", "Cached characters", "Jobs"]
    exported = {row[0]: row[1] for row in lines[1:-1]}
    on_page = {row[0]: row[1].replace(",", "") for row in shown}
    assert {label.lstrip("'"): n for label, n in exported.items()} == on_page
    assert any(label.startswith("'@batch") for label in exported)  # a formula-looking cell, escaped
    assert lines[-1] == ["Total", "8500", "0", "3"]


def test_it_rotates_a_key_and_finds_and_re_renders_a_job_with_the_keyboard(
    context: Any, edge: NginxInstance, busy_tenant: dict[str, Any]
) -> None:
    page = signed_in(context, edge, busy_tenant["user"])
    page.goto("/app/keys/")
    check_page(page, "keys-lifecycle")
    row = page.locator("#key-list tr", has_text="backend")
    row.locator("select").focus()
    page.keyboard.press("Tab")  # to Rotate
    page.keyboard.press("Enter")
    page.wait_for_selector("#new-key")
    assert "keeps working until" in page.locator("#rotation-note").inner_text()
    check_page(page, "keys-rotated")

    page.goto("/app/history/")
    page.focus("#id_q")
    page.keyboard.type("quarterly")
    page.keyboard.press("Enter")
    page.wait_for_url("**q=quarterly**")
    assert page.locator("tbody tr").count() == 1
    check_page(page, "history-search")
    page.get_by_role("link", name="Edit and re-render this job").focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**from_job=**")
    assert page.locator("#text").input_value() == "Please read the quarterly report aloud."
    assert page.locator("#speed").input_value() == "1.5"
    check_page(page, "synthesize-prefilled")
