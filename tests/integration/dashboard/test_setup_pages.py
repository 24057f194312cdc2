"""The Dictionaries and Webhooks pages: the API's services behind them, roles deciding who changes
what, another tenant's ids a 404, and bad input a form error, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.dashboard_data import make_job, make_owner, member_of
from tests.integration.dashboard.conftest import client_for

RULES = "Acme = ack me\nNASA == nassa"


@pytest.fixture
def brands(owner: tuple[Any, Any]) -> Any:
    from synth import lexicon
    from webapp.dictionaries import services

    dictionary, _version = services.create_dictionary(
        owner[1], "brands", [lexicon.Rule(grapheme="Acme", alias="ack me")]
    )
    return dictionary


@pytest.fixture
def endpoint(owner: tuple[Any, Any]) -> Any:
    from webapp.webhooks import services

    return services.create_endpoint(owner[1], "https://hooks.example.com/a", ["job.succeeded"])


def test_a_viewer_reads_dictionaries_without_change_controls_and_its_posts_are_refused(
    owner: tuple[Any, Any], brands: Any
) -> None:
    from webapp.dictionaries.models import Dictionary

    viewer = client_for(member_of(owner[1], "viewer@example.com", "viewer"))
    listing = viewer.get("/app/dictionaries/").content.decode()
    assert "brands" in listing and "Create a dictionary" not in listing
    detail = viewer.get(f"/app/dictionaries/{brands.pk}/").content.decode()
    assert "ack me" in detail and "New version" not in detail and "Delete dictionary" not in detail
    assert "Webhooks" not in detail  # the nav shows the managers' pages to managers only
    assert viewer.post("/app/dictionaries/", {"name": "x", "rules": RULES}).status_code == 403
    assert viewer.post(f"/app/dictionaries/{brands.pk}/versions/", {"rules": RULES}).status_code == 403
    assert viewer.post(f"/app/dictionaries/{brands.pk}/delete/").status_code == 403
    assert viewer.post(f"/app/dictionaries/{brands.pk}/default/", {"make": "1"}).status_code == 403
    assert list(Dictionary.objects.values_list("name", "latest_version", "is_default")) == [
        ("brands", 1, False)
    ]
    assert viewer.get(f"/app/dictionaries/{brands.pk}/versions/1/export.pls").status_code == 200


def test_only_owners_and_admins_open_the_webhooks_pages(owner: tuple[Any, Any], endpoint: Any) -> None:
    member = client_for(member_of(owner[1], "member@example.com", "member"))
    assert member.get("/app/webhooks/").status_code == 403
    assert (
        member.post("/app/webhooks/", {"url": "https://x.example.com/", "events": ["ping"]}).status_code
        == 403
    )
    assert member.post(f"/app/webhooks/{endpoint.pk}/delete/").status_code == 403
    admin = client_for(member_of(owner[1], "admin@example.com", "admin"))
    page = admin.get(f"/app/webhooks/{endpoint.pk}/").content.decode()
    assert "Send a ping" in page and endpoint.secret not in page  # the secret is shown only once


def test_another_tenants_ids_are_404(owner: tuple[Any, Any], brands: Any, endpoint: Any) -> None:
    from webapp.webhooks import services

    message = services.ping(endpoint)
    other = client_for(make_owner("other@example.com", "Other")[0])
    for path in (f"/app/dictionaries/{brands.pk}/", f"/app/dictionaries/{brands.pk}/versions/1/export.pls"):
        assert other.get(path).status_code == 404, path
    for path in (
        f"/app/dictionaries/{brands.pk}/delete/",
        f"/app/dictionaries/{brands.pk}/versions/",
        f"/app/webhooks/{endpoint.pk}/ping/",
        f"/app/webhooks/{endpoint.pk}/rotate/",
        f"/app/webhooks/{endpoint.pk}/delete/",
        f"/app/webhooks/deliveries/{message.pk}/redeliver/",
    ):
        assert other.post(path, {"overlap": "0", "rules": RULES}).status_code == 404, path
    assert other.get(f"/app/webhooks/{endpoint.pk}/").status_code == 404
    assert client_for(owner[0]).get(f"/app/webhooks/{endpoint.pk}/").status_code == 200


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ({"name": "a", "rules": "Acme ack me"}, "Line 1: write"),
        ({"name": "a", "rules": "x = [klingon] qa"}, "phonemes are written"),
        ({"name": "a", "rules": "tomato = [arpabet] XX YY"}, "Rule 1 ("),
        ({"name": "a", "rules": ""}, "Enter at least one rule"),
        ({"name": "", "rules": RULES}, "This field is required"),
        ({"name": "brands", "rules": RULES}, "There is a dictionary named"),
    ],
)
def test_bad_dictionary_input_is_a_form_error(
    owner: tuple[Any, Any], brands: Any, data: dict[str, str], shown: str
) -> None:
    answer = client_for(owner[0]).post("/app/dictionaries/", data)
    assert answer.status_code == 400 and shown in answer.content.decode()


def test_a_pls_upload_makes_a_version_and_a_broken_one_is_a_form_error(
    owner: tuple[Any, Any], brands: Any
) -> None:
    from webapp.dictionaries import pls, services

    client = client_for(owner[0])
    v1 = brands.versions.get(number=1)
    body = pls.export(services.synth_rules(v1), "en-US")
    upload = SimpleUploadedFile("b.pls", body, content_type="application/pls+xml")
    answer = client.post(f"/app/dictionaries/{brands.pk}/versions/", {"pls_file": upload})
    assert answer.status_code == 302
    assert brands.versions.get(number=2).language == "en-US"
    evil = b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa">]><lexicon>&a;</lexicon>'
    upload = SimpleUploadedFile("e.pls", evil, content_type="application/pls+xml")
    refused = client.post(f"/app/dictionaries/{brands.pk}/versions/", {"pls_file": upload})
    assert refused.status_code == 400 and 'class="error"' in refused.content.decode()
    assert brands.versions.count() == 2


def test_a_dictionary_pinned_by_a_queued_job_is_not_deleted_and_the_page_says_why(
    owner: tuple[Any, Any], brands: Any
) -> None:
    job = make_job(owner[1], owner[0], status="queued")
    job.pinned_dictionary_versions.add(brands.versions.get(number=1))
    client = client_for(owner[0])
    answer = client.post(f"/app/dictionaries/{brands.pk}/delete/", follow=True)
    assert "Queued or running jobs pin a version of this dictionary" in answer.content.decode()
    assert str(job.pk) in answer.content.decode()
    job.status = "succeeded"
    job.save()
    gone = client.post(f"/app/dictionaries/{brands.pk}/delete/", follow=True).content.decode()
    assert "and its versions are deleted" in gone


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ({"url": "http://hooks.example.com/", "events": ["job.failed"]}, "must start with https://"),
        ({"url": "https://10.0.0.1/", "events": ["job.failed"]}, "public addresses only"),
        ({"url": "https://hooks.example.com/", "events": ["job.exploded"]}, "Select a valid choice"),
        ({"url": "https://hooks.example.com/"}, "This field is required"),
    ],
)
def test_bad_webhook_input_is_a_form_error(owner: tuple[Any, Any], data: dict[str, Any], shown: str) -> None:
    from webapp.webhooks.models import WebhookEndpoint

    answer = client_for(owner[0]).post("/app/webhooks/", data)
    assert answer.status_code == 400 and shown in answer.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_the_secret_is_shown_once_and_a_disabled_endpoint_is_not_redelivered(
    owner: tuple[Any, Any], endpoint: Any
) -> None:
    from webapp.webhooks import services

    client = client_for(owner[0])
    made = client.post(
        "/app/webhooks/", {"url": "https://b.example.com/", "events": ["voice.ready"], "enabled": "on"}
    )
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    assert 'id="new-secret">whsec_' in made.content.decode()
    message = services.ping(endpoint)
    edit = {"url": endpoint.url, "events": ["job.succeeded"], "description": "off for now"}
    assert client.post(f"/app/webhooks/{endpoint.pk}/edit/", edit).status_code == 302
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.description == "off for now"
    page = client.post(f"/app/webhooks/deliveries/{message.pk}/redeliver/", follow=True).content.decode()
    assert "The endpoint is disabled; enable it first" in page


def test_the_delivery_log_shows_each_attempt_with_its_answer_latency_and_excerpt(
    owner: tuple[Any, Any], endpoint: Any
) -> None:
    from django.utils import timezone

    from webapp.webhooks import services
    from webapp.webhooks.models import WebhookAttempt

    message = services.ping(endpoint)
    WebhookAttempt.objects.create(
        message=message,
        started_at=timezone.now(),
        status_code=503,
        latency_ms=1234,
        error="HTTP 503",
        response_excerpt="<b>busy</b>",
    )
    message.attempts, message.last_status_code = 1, 503
    message.save()
    page = client_for(owner[0]).get(f"/app/webhooks/{endpoint.pk}/").content.decode()
    row = page[page.index(f'data-delivery="{message.pk}"') :]
    assert "HTTP 503" in row and "1,234 ms" in row and "&lt;b&gt;busy&lt;/b&gt;" in row
    assert message.webhook_id in row and "Redeliver" in row
