"""Invitations (issue 31, finding 6): a pending row, not an account; nothing tells whether an address is registered."""

from __future__ import annotations

import re
from typing import Any, cast

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client, override_settings

from tests.dashboard_data import PASSWORD, make_owner, member_of
from tests.integration.dashboard.conftest import client_for, redirect_url
from tests.redis_database import clear_cache
from webapp.audit.models import AuditEvent
from webapp.tenants.models import Membership

LINK = r"/accounts/invitation/[A-Za-z0-9_-]+/"


@pytest.fixture(autouse=True)
def fresh_counters(stack: Any) -> None:
    clear_cache()


def _body(index: int = -1) -> str:
    return cast(str, mail.outbox[index].body)


def _link(index: int = -1) -> str:
    match = re.search(LINK, _body(index))
    assert match, _body(index)
    return match.group(0)


def _invite(client: Client, email: str, role: str = "member") -> Any:
    return client.post("/app/members/", {"email": email, "role": role})


def test_an_invitation_is_a_pending_row_and_the_person_sets_a_password_through_the_link(
    owner: tuple[Any, Any],
) -> None:
    user, org = owner
    _invite(client_for(user), "new.member@example.com", "admin")
    assert not get_user_model().objects.filter(email__iexact="new.member@example.com").exists()
    assert mail.outbox[-1].to == ["new.member@example.com"]

    person = Client()
    link = _link()
    page = person.get(link)
    assert page.status_code == 200 and org.name in page.content.decode()
    done = person.post(link, {"new_password1": PASSWORD, "new_password2": PASSWORD})
    assert redirect_url(done) == "/app/synthesize/"
    membership = Membership.objects.get(user__email="new.member@example.com", organization=org)
    assert membership.role == "admin" and membership.user.check_password(PASSWORD)
    assert person.get("/app/history/").status_code == 200  # signed in, address proven by the link
    assert person.get(link).status_code == 400  # used once
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"member.invited", "invitation.accepted"} <= actions


def test_an_invited_address_is_not_squatted_its_owner_can_still_sign_up(owner: tuple[Any, Any]) -> None:
    _invite(client_for(owner[0]), "squat@example.com", "admin")
    signup = Client().post(
        "/accounts/signup/", {"email": "squat@example.com", "organization": "Mine", "password": PASSWORD}
    )
    assert redirect_url(signup) == "/app/account/"
    assert get_user_model().objects.get(email="squat@example.com").has_usable_password()


def test_answers_and_mails_do_not_tell_whether_an_address_has_an_account(owner: tuple[Any, Any]) -> None:
    make_owner("known@example.com", organization="Elsewhere")
    client = client_for(owner[0])
    answers = []
    for email in ("known@example.com", "unknown@example.com"):
        response = _invite(client, email)
        assert response.status_code == 302
        page = client.get("/app/members/")
        answers.append(
            (
                [str(m) for m in page.context["messages"]],
                re.sub(LINK, "LINK", _body()).replace(email, "ADDRESS"),
            )
        )
    known, unknown = answers
    assert known[1] == unknown[1]
    assert [m.replace("known@", "unknown@") for m in known[0]] == unknown[0]
    html = client.get("/app/members/").content.decode()
    assert html.count('data-invitation="') == 2 and 'badge">invited' not in html
    assert not Membership.objects.filter(user__email="known@example.com", organization=owner[1]).exists()


def test_an_existing_account_joins_by_signing_in_through_the_link(owner: tuple[Any, Any]) -> None:
    known, _ = make_owner("known@example.com", organization="Elsewhere")
    _invite(client_for(owner[0]), "Known@Example.com", "viewer")
    link = _link()
    stranger = Client()
    refused = stranger.post(link, {"new_password1": PASSWORD + "x", "new_password2": PASSWORD + "x"})
    assert refused.status_code == 403 and "/accounts/login/" in refused.content.decode()
    known.refresh_from_db()
    assert known.check_password(PASSWORD)  # the link never resets an existing password
    signed_in = client_for(known)
    assert redirect_url(signed_in.post(link)) == "/app/synthesize/"
    assert Membership.objects.get(user=known, organization=owner[1]).role == "viewer"


def test_the_link_works_only_for_the_invited_address(owner: tuple[Any, Any]) -> None:
    _invite(client_for(owner[0]), "invited@example.com")
    other, _ = make_owner("other@example.com", organization="Other")
    client_for(other).post(_link())
    assert not Membership.objects.filter(user=other, organization=owner[1]).exists()


def test_an_unverified_account_cannot_invite(db: None) -> None:
    client = Client()
    client.post(
        "/accounts/signup/", {"email": "fresh@example.com", "organization": "F", "password": PASSWORD}
    )
    sent = len(mail.outbox)
    client.post("/app/members/", {"email": "fresh.admin@example.com", "role": "admin"})
    assert len(mail.outbox) == sent
    from webapp.tenants.models import Invitation

    assert not Invitation.objects.exists()


def test_the_invitation_mail_carries_no_text_the_inviter_chose(db: None) -> None:
    user, _ = make_owner(organization="Win a prize at evil.example now")
    _invite(client_for(user), "target@example.com")
    assert "evil.example" not in _body() and "evil.example" not in mail.outbox[-1].subject


@override_settings(TTS_INVITATIONS_PER_INVITER_HOURLY=2, TTS_INVITATIONS_PER_TENANT_HOURLY=3)
def test_invitations_are_rate_limited_per_inviter_and_per_tenant(owner: tuple[Any, Any]) -> None:
    from webapp.tenants.models import Invitation

    user, org = owner
    owner_client = client_for(user)
    for n in range(2):
        assert _invite(owner_client, f"p{n}@example.com").status_code == 302
    assert _invite(owner_client, "p2@example.com").status_code == 429
    admin_client = client_for(member_of(org, "admin@example.com", "admin"))
    assert _invite(admin_client, "p3@example.com").status_code == 302
    assert _invite(admin_client, "p4@example.com").status_code == 429  # the tenant's third was the last
    assert sorted(Invitation.objects.values_list("email", flat=True)) == [
        "p0@example.com",
        "p1@example.com",
        "p3@example.com",
    ]


def test_a_withdrawn_invitation_link_stops_working(owner: tuple[Any, Any]) -> None:
    from webapp.tenants.models import Invitation

    client = client_for(owner[0])
    _invite(client, "later@example.com")
    invitation = Invitation.objects.get(email="later@example.com")
    client.post(f"/app/members/invitations/{invitation.pk}/withdraw/")
    assert Client().get(_link()).status_code == 400
    assert AuditEvent.objects.filter(action="invitation.withdrawn").exists()


def test_role_changes_and_removals_are_audited(owner: tuple[Any, Any]) -> None:
    user, org = owner
    other = member_of(org, "m@example.com", "member")
    membership = Membership.objects.get(user=other)
    client = client_for(user)
    client.post(f"/app/members/{membership.pk}/role/", {"role": "viewer"})
    client.post(f"/app/members/{membership.pk}/remove/")
    events = {e.action: e for e in AuditEvent.objects.filter(organization_id=org.pk)}
    assert events["member.role_changed"].details == {"from": "member", "to": "viewer"}
    assert events["member.removed"].actor_id == user.pk


def test_an_expired_invitation_link_is_refused_and_listed_as_expired(owner: tuple[Any, Any]) -> None:
    import datetime as dt

    from django.utils import timezone

    from webapp.tenants.models import Invitation

    client = client_for(owner[0])
    _invite(client, "slow@example.com")
    Invitation.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    link = _link()
    assert Client().get(link).status_code == 400
    assert Client().post(link, {"new_password1": PASSWORD, "new_password2": PASSWORD}).status_code == 400
    assert not get_user_model().objects.filter(email="slow@example.com").exists()
    assert "expired" in client.get("/app/members/").content.decode()
