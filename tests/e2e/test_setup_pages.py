"""The pages a tenant sets up once (issue 35 item 6) in Chromium through Nginx: pronunciation dictionaries
(a dictionary with a version, its rules table, a PLS export) and webhooks (an endpoint, its secret shown
once, a ping in the delivery log, a redelivery); axe-core on each page, the keyboard alone where it matters.

The session's web stack (gunicorn behind Nginx) and one browser for the module. The endpoint's
https URL is never called: no webhooks worker runs here, so the ping stays pending in the log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.dashboard_browser import BASE, check_page, new_context

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

HOOK_URL = "https://hooks.example.com/tts"


@pytest.fixture
def page(browser: Any, web: Any, transactional_db: None) -> Iterator[Any]:
    """A page signed in as a new tenant's owner (no login POST: Nginx's strict zone is for people)."""
    from django.test import Client

    from tests.dashboard_data import make_owner

    user, _org = make_owner("setup.owner@example.com", "Setup Co")
    client = Client()
    client.force_login(user)
    ctx = new_context(browser)
    ctx.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": BASE}])
    yield ctx.new_page()
    ctx.close()


def test_it_creates_a_dictionary_adds_a_version_and_exports_it_as_pls(page: Any) -> None:
    page.goto("/app/dictionaries/")
    assert page.locator("#dictionary-list").count() == 0
    check_page(page, "dictionaries-empty")
    # The keyboard alone: type into the form's fields and submit with Enter on the button.
    page.focus("#id_name")
    page.keyboard.type("brands")
    page.keyboard.press("Tab")
    page.keyboard.type("Product names")
    page.keyboard.press("Tab")
    page.keyboard.type("Acme = ack me\nNASA == nassa")
    page.locator("#dictionary-create button[type=submit]").focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/app/dictionaries/*-*/")
    assert "is created with 2 rules" in page.locator(".messages").inner_text()
    rules = page.locator("#rule-table tbody tr").all_inner_texts()
    assert [r.split("\t")[1:4] for r in rules] == [["Acme", "any", "ack me"], ["NASA", "exact", "nassa"]]
    check_page(page, "dictionary-v1")

    box = page.locator("#version-create textarea")
    assert box.input_value() == "Acme = ack me\nNASA == nassa"  # the next version starts from the latest
    box.fill("Acme = ack me\nNASA == nassa\ntomato = [arpabet] T AH0 M EY1 T OW0")
    page.get_by_role("button", name="Save version 2").click()
    page.wait_for_selector("#version-list tr[data-version='2']")
    assert page.locator("#rule-table tbody tr").count() == 3
    with page.expect_download() as download:
        page.get_by_role("link", name="Export version 2 as PLS").click()
    body = open(download.value.path(), encoding="utf-8").read()
    assert download.value.suggested_filename == "brands-v2.pls"
    assert "<grapheme>tomato</grapheme>" in body and "x-arpabet" in body

    page.get_by_role("link", name="Show the rules of version 1").click()
    page.wait_for_url("**?version=1")
    assert page.locator("#rule-table tbody tr").count() == 2
    page.get_by_role("button", name="Make it the default").click()
    page.get_by_role("button", name="Stop being the default").wait_for()
    assert "applies to every request" in page.locator("#default-state").inner_text()
    page.goto("/app/dictionaries/")
    assert "default" in page.locator("#dictionary-list tbody tr").inner_text()
    check_page(page, "dictionaries-list")


def test_it_shows_a_webhook_secret_once_pings_and_redelivers(page: Any) -> None:
    page.goto("/app/webhooks/")
    check_page(page, "webhooks-empty")
    page.focus("#id_url")
    page.keyboard.type(HOOK_URL)
    page.get_by_label("job.succeeded").check()
    page.get_by_label("job.failed").check()
    page.get_by_role("button", name="Add endpoint").click()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("whsec_")
    check_page(page, "webhooks-created")
    page.goto("/app/webhooks/")  # shown once: never again
    assert page.locator("#new-secret").count() == 0 and secret not in page.content()
    page.get_by_role("link", name=HOOK_URL).click()
    page.wait_for_selector("#endpoint-url")
    assert secret not in page.content()

    page.focus("#ping")
    page.keyboard.press("Enter")
    page.wait_for_selector("#delivery-log tr[data-delivery]")
    row = page.locator("#delivery-log tbody tr").first
    assert "ping" in row.inner_text() and row.get_attribute("data-status") == "pending"
    check_page(page, "webhook-pinged")
    row.get_by_role("button", name="Redeliver").click()
    page.wait_for_selector(".messages >> text=is sent again")
    assert page.locator("#delivery-log tbody tr").count() == 1  # the same message, not a new one

    page.get_by_role("button", name="Rotate secret").click()
    rotated = page.locator("#new-secret").inner_text()
    assert rotated.startswith("whsec_") and rotated != secret
    assert "signed with both secrets" in page.locator("#rotation-note").inner_text()
    check_page(page, "webhook-rotated")
