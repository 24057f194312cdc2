"""The quota a tenant sees coming: numbers for people, what is left and when it resets, the banner at
80 % and 100 %, and one e-mail to the owners per level and month."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail

from tests.dashboard_data import member_of
from tests.integration.dashboard.conftest import client_for
from tests.usage_data import billed_job


@pytest.fixture
def small_plan(owner: tuple[Any, Any]) -> Any:
    from webapp.tenants.models import Plan

    user, org = owner
    org.plan = Plan.objects.create(
        slug="small", name="Small", monthly_characters=1_000_000, storage_bytes=3 * 1024**3
    )
    org.save()
    return org


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("count", 1000000000, "1,000,000,000"),
        ("count", 7, "7"),
        ("size", 512, "512 bytes"),
        ("size", 1536 * 1024, "1.5 MB"),
        ("size", 20 * 1024**3, "20 GB"),
        ("duration", 0.84, "0.8 s"),
        ("duration", 42.2, "42 s"),
        ("duration", 185, "3 min 05 s"),
        ("duration", 3720, "1 h 02 min"),
        ("duration", 3 * 86400 + 3600, "3 d 01 h"),
        ("duration", -1, ""),
    ],
)
def test_it_writes_numbers_for_people(name: str, value: Any, shown: str) -> None:
    from webapp.dashboard.templatetags import humane

    assert getattr(humane, name)(value) == shown


def test_it_shows_what_is_left_and_when_it_resets(owner: tuple[Any, Any], small_plan: Any) -> None:
    from webapp.speech.services import ledger

    billed_job(small_plan, 12_345, user=owner[0])
    html = client_for(owner[0]).get("/app/usage/").content.decode()
    assert "<strong>12,345</strong> characters used" in html
    assert "<strong>987,655</strong> characters left" in html
    assert f"{ledger.period_end():%-d %B %Y}, 00:00 UTC" in html
    assert "1,000,000 characters a month" in html and "3 GB" in html
    assert 'id="quota-banner"' not in html
    synth = client_for(owner[0]).get("/app/synthesize/").content.decode()
    assert "987,655 left this month" in synth


def test_it_warns_at_80_percent_and_says_when_the_quota_is_used_up(
    owner: tuple[Any, Any], small_plan: Any
) -> None:
    billed_job(small_plan, 800_000, user=owner[0])
    page = client_for(owner[0]).get("/app/history/").content.decode()
    assert 'id="quota-banner"' in page and "80 % of this month's characters are used" in page
    billed_job(small_plan, 200_000, user=owner[0])
    page = client_for(owner[0]).get("/app/voices/").content.decode()
    assert "This month's characters are used up" in page and "new requests are refused" in page


def test_it_mails_the_owners_once_per_level_and_month(
    owner: tuple[Any, Any], small_plan: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from webapp.speech.models import UsagePeriod

    member_of(small_plan, "member@example.com", "member")
    co_owner = member_of(small_plan, "co-owner@example.com", "owner")
    with django_capture_on_commit_callbacks(execute=True):
        billed_job(small_plan, 500_000, user=owner[0])
    assert mail.outbox == []
    with django_capture_on_commit_callbacks(execute=True):
        billed_job(small_plan, 310_000, user=owner[0])
        billed_job(small_plan, 10_000, user=owner[0])
    assert len(mail.outbox) == 1
    first = mail.outbox[0]
    assert sorted(first.to) == sorted([owner[0].email, co_owner.email])
    assert "81 %" in str(first.body) and "810,000 of its 1,000,000" in str(first.body)
    assert "80 %" in first.subject and "/app/usage/" in str(first.body)
    with django_capture_on_commit_callbacks(execute=True):
        billed_job(small_plan, 300_000, user=owner[0])
        billed_job(small_plan, 1, user=owner[0])
    assert len(mail.outbox) == 2 and "used all of this month's characters" in mail.outbox[1].subject
    assert UsagePeriod.objects.get(organization=small_plan).quota_level_announced == 100
