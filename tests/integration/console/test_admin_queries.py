"""Admin list pages: a bounded number of queries, whatever the number of rows."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.integration.console.conftest import staff_client

PAGES = [
    "/admin/speech/synthesisjob/",
    "/admin/speech/synthesisjob/?status__exact=queued&device=cpu",
    "/admin/speech/synthesisjob/?q=hello",
    "/admin/tenants/organization/",
    "/admin/tenants/plan/",
    "/admin/tenants/apikey/",
    "/admin/tenants/membership/",
    "/admin/audit/auditevent/",
    "/admin/speech/voice/",
]
# Measured: 5-6 per page, 8 for the audit log (its date hierarchy); one more would be a query per row.
MAX_QUERIES = 8


def _add_jobs(tenants: list[Any], n: int) -> None:
    from webapp.speech.models import SynthesisJob

    SynthesisJob.objects.bulk_create(
        SynthesisJob(
            organization=tenants[i % len(tenants)].org,
            voice_name="espeak-en",
            engine="espeak",
            text=f"hello {i}",
            text_chars=7,
            format="wav",
            metrics={"device": "cpu"},
        )
        for i in range(n)
    )


def _query_counts(client: Any) -> dict[str, int]:
    counts = {}
    for page in PAGES:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(page)
        assert response.status_code == 200, page
        counts[page] = len(queries)
    return counts


def test_list_pages_issue_a_bounded_number_of_queries_with_200_jobs(make_tenant: Any) -> None:
    tenants = [make_tenant() for _ in range(3)]
    client, _ = staff_client()
    _add_jobs(tenants, 10)
    few = _query_counts(client)
    _add_jobs(tenants, 190)
    tenants += [make_tenant() for _ in range(5)]
    many = _query_counts(client)
    assert many == few, {page: (few[page], many[page]) for page in PAGES if few[page] != many[page]}
    assert max(many.values()) <= MAX_QUERIES, many


def test_jobs_are_found_by_text_and_by_id(make_tenant: Any) -> None:
    from webapp.speech.models import SynthesisJob

    _add_jobs([make_tenant()], 12)
    client, _ = staff_client()
    some = SynthesisJob.objects.order_by("created_at").first()
    assert some is not None
    for query, expected in [("hello 7", 1), ("hello", 12), (str(some.pk), 1), ("nothing like it", 0)]:
        response = client.get("/admin/speech/synthesisjob/", {"q": query})
        assert response.status_code == 200
        assert response.context["cl"].result_count == expected, query


def test_a_users_page_lists_the_tenants_they_belong_to(make_tenant: Any) -> None:
    from django.contrib.auth.models import User

    from webapp.tenants.models import Membership

    tenant = make_tenant()
    member = User.objects.create_user("zz-listed-member", "m@example.test", "pw-member-123")
    Membership.objects.create(user=member, organization=tenant.org, role="viewer")
    client, _ = staff_client()
    assert client.get("/admin/").status_code == 200
    page = client.get(f"/admin/auth/user/{member.pk}/change/")
    assert page.status_code == 200
    formset = page.context["inline_admin_formsets"][0].formset
    assert [(f.instance.organization_id, f.instance.role) for f in formset.forms] == [
        (tenant.org.pk, "viewer")
    ]
