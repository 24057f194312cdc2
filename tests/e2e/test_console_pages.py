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
from tests.e2e.dashboard_browser import CHROMIUM, CHROMIUM_ARGS, CSP_WATCH, check_page
from tests.e2e.nginx_helpers import NginxInstance, start_nginx
from tests.stack import CFG, django_env
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
        Service("gunicorn-console", command, env=django_env("gunicorn", **CONSOLE_ENV))
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


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
