"""The usage explorer: GET /api/v1/usage's grouping and range, the dashboard's table and its CSV, all
equal to the ledger for a tenant with several keys, voices, sources and members, jobs deleted or not."""

from __future__ import annotations

import csv
import datetime as dt
import importlib
import io
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tests.dashboard_data import member_of
from tests.integration.api.conftest import ApiClient, problem
from tests.integration.dashboard.conftest import client_for
from tests.usage_data import billed_job

GROUPS = ("day", "key", "voice", "source", "member")


@pytest.fixture
def tenant(owner: tuple[Any, Any]) -> dict[str, Any]:
    """Two keys (one named like a formula), two voices, three sources, two members, over three days."""
    from webapp.tenants.services import OPERATOR, create_api_key

    user, org = owner
    other = member_of(org, "member@example.com", "member")
    key_a, raw_a = create_api_key(org, "backend", created_by=OPERATOR, scopes=["speech:read"])
    key_b, _ = create_api_key(org, '=HYPERLINK("http://x")', created_by=OPERATOR, scopes=["speech:read"])
    today = timezone.now().astimezone(dt.UTC)
    first = today.replace(day=1, hour=8)
    days = [first, first + dt.timedelta(hours=5), max(first, today - dt.timedelta(hours=1))]
    specs = [
        (120, user, key_a, "en_US-joe-medium", "api", days[0]),
        (45, user, key_a, "en_US-amy-medium", "openai", days[0]),
        (300, other, key_b, "en_US-joe-medium", "api", days[1]),
        (7, other, None, "en_US-amy-medium", "dashboard", days[2]),
        (64, user, None, "en_US-joe-medium", "dashboard", days[2]),
    ]
    jobs = [billed_job(org, n, user=u, key=k, voice=v, source=s, when=w) for n, u, k, v, s, w in specs]
    by_day: dict[str, tuple[int, int]] = {}  # UTC day of the submit: (characters, jobs)
    for n, *_, when in specs:
        chars, count = by_day.get(when.date().isoformat(), (0, 0))
        by_day[when.date().isoformat()] = (chars + n, count + 1)
    return {
        "org": org,
        "user": user,
        "api": ApiClient(raw_a),
        "jobs": jobs,
        "total": 120 + 45 + 300 + 7 + 64,
        "by_day": by_day,
    }


def _bill(org: Any) -> int:
    from webapp.speech.models import UsagePeriod
    from webapp.speech.services import ledger

    return UsagePeriod.objects.get(organization=org, period=ledger.period_start()).characters_used


def _api_rows(api: ApiClient, group: str) -> dict[str, Any]:
    response = api.get("/api/v1/usage", {"group_by": group})
    assert response.status_code == 200, response.content
    usage: dict[str, Any] = response.json()["usage"]
    return usage


def _csv(client: Any, group: str) -> list[list[str]]:
    response = client.get("/app/usage/export.csv", {"group_by": group})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))


def _shown(usage: dict[str, Any]) -> list[list[str]]:
    """What the CSV carries for the API's rows (formula-looking labels escaped)."""
    rows = []
    for row in usage["rows"]:
        label = row["label"]
        label = "'" + label if label[:1] in ("=", "+", "-", "@") else label
        rows.append([label, str(row["characters"]), str(row["cached_characters"]), str(row["jobs"])])
    return rows


def test_it_equals_the_ledger_through_the_api_the_table_and_the_csv(tenant: dict[str, Any]) -> None:
    org, api, page = tenant["org"], tenant["api"], client_for(tenant["user"])
    assert _bill(org) == tenant["total"]
    for group in GROUPS:
        usage = _api_rows(api, group)
        assert usage["total"]["characters"] == tenant["total"] == sum(r["characters"] for r in usage["rows"])
        assert usage["total"]["jobs"] == 5
        exported = _csv(page, group)
        assert exported[1:-1] == _shown(usage)
        assert exported[-1] == ["Total", str(tenant["total"]), "0", "5"]
        html = page.get("/app/usage/", {"group_by": group}).content.decode()
        assert f"<strong>{tenant['total']:,}</strong> characters charged" in html
    by_source = {r["group"]: r["characters"] for r in _api_rows(api, "source")["rows"]}
    assert by_source == {"api": 420, "openai": 45, "dashboard": 71}
    by_key = {r["label"]: r["characters"] for r in _api_rows(api, "key")["rows"]}
    assert (
        by_key["no key (dashboard)"] == 71
        and by_key[next(k for k in by_key if k.startswith("backend"))] == 165
    )
    by_member = {r["label"]: r["characters"] for r in _api_rows(api, "member")["rows"]}
    assert by_member == {"owner@example.com": 120 + 45 + 64, "member@example.com": 307}
    assert "'=HYPERLINK" in "".join(",".join(r) for r in _csv(page, "key"))


def test_a_member_who_left_is_a_former_member_not_their_address_today(tenant: dict[str, Any]) -> None:
    """They keep their account and may change its address: the tenant is not told the new one."""
    from django.contrib.auth import get_user_model

    from webapp.tenants.models import Membership

    Membership.objects.filter(organization=tenant["org"], user__email="member@example.com").delete()
    get_user_model().objects.filter(email="member@example.com").update(email="moved-on@elsewhere.example")
    by_member = {r["label"]: r["characters"] for r in _api_rows(tenant["api"], "member")["rows"]}
    assert by_member == {"owner@example.com": 120 + 45 + 64, "former member": 307}


def test_it_keeps_the_breakdown_after_the_jobs_are_deleted(tenant: dict[str, Any]) -> None:
    from webapp.speech.models import SynthesisJob

    before = {group: _api_rows(tenant["api"], group) for group in GROUPS}
    SynthesisJob.objects.filter(organization=tenant["org"]).delete()
    for group in GROUPS:
        assert _api_rows(tenant["api"], group) == before[group]
    assert _bill(tenant["org"]) == before["day"]["total"]["characters"]


def test_it_groups_by_day_over_the_range_asked(tenant: dict[str, Any]) -> None:
    today = timezone.now().astimezone(dt.UTC).date()
    first = today.replace(day=1)
    usage = (
        tenant["api"]
        .get("/api/v1/usage", {"from": first.isoformat(), "to": today.isoformat()})
        .json()["usage"]
    )
    assert usage["group_by"] == "day" and [r["group"] for r in usage["rows"]][0] == first.isoformat()
    assert len(usage["rows"]) == (today - first).days + 1
    # Each day its own characters and jobs, the days without any at zero.
    charged = {r["group"]: (r["characters"], r["jobs"]) for r in usage["rows"] if r["jobs"]}
    assert charged == tenant["by_day"]
    assert all(r["characters"] == 0 for r in usage["rows"] if r["group"] not in charged)
    last_month = tenant["api"].get("/api/v1/usage", {"to": (first - dt.timedelta(days=1)).isoformat()})
    assert last_month.json()["usage"]["total"]["characters"] == 0
    page = client_for(tenant["user"]).get("/app/usage/", {"period": "last"}).content.decode()
    assert "Nothing charged in this period." in page


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "2026-03-10", "to": "2026-03-01"}, "from"),
        ({"from": "2024-01-01", "to": "2026-01-01"}, "to"),
        ({"group_by": "colour"}, "group_by"),
        ({"from": "2026-13-01"}, "from"),
        ({"to": "yesterday"}, "to"),
        ({"from": "2026-3-1"}, "from"),
    ],
)
def test_it_refuses_a_bad_range_or_grouping(
    tenant: dict[str, Any], query: dict[str, str], field: str
) -> None:
    response = tenant["api"].get("/api/v1/usage", query)
    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "invalid_request" and body.get("field") == field, body
    page = client_for(tenant["user"])
    assert page.get("/app/usage/export.csv", {"period": "range", **query}).status_code == 400
    assert page.get("/app/usage/", {"period": "range", **query}).status_code == 400


def test_the_migration_backfills_events_from_the_jobs_that_remain(tenant: dict[str, Any]) -> None:
    from webapp.speech.models import UsageEvent

    migration = importlib.import_module("webapp.speech.migrations.0013_usage_dimensions")
    kept, gone = tenant["jobs"][0], tenant["jobs"][2]
    gone_id = gone.id
    UsageEvent.objects.filter(organization=tenant["org"]).update(
        api_key=None, user=None, voice_name="", source=""
    )
    gone.delete()
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL)
    restored = set(
        UsageEvent.objects.filter(job_key=kept.id).values_list("api_key", "user", "voice_name", "source")
    )
    assert restored == {(kept.api_key_id, kept.user_id, kept.voice_name, kept.source)}
    assert set(UsageEvent.objects.filter(job_key=gone_id).values_list("voice_name", flat=True)) == {""}
