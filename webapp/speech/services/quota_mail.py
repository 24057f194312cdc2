"""The e-mail to a tenant's owners when its month's charges reach a quota level (80 %, 100 %).

Sent after the settling transaction commits (subscribed to the job events that
carry a settlement, ``webapp.speech.services.events``), for the highest level it crossed,
through Django's mail backend as the account mails are; a mail server that is
down costs the owners the mail, never the job its settlement.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from webapp.public_urls import public_url_for
from webapp.speech.services import events
from webapp.tenants.models import Membership, Organization

log = logging.getLogger(__name__)


def owner_addresses(organization_id: Any) -> list[str]:
    return sorted(
        set(
            Membership.objects.filter(organization_id=organization_id, role=Membership.Role.OWNER)
            .exclude(user__email="")
            .values_list("user__email", flat=True)
        )
    )


def message(name: str, level: int, used: int, monthly: int, resets: dt.datetime) -> tuple[str, str]:
    """Subject and body of the mail for ``level`` percent."""
    reset_day = f"{resets:%-d %B %Y}"
    if level >= 100:
        subject = f"{name} has used all of this month's characters"
        consequence = f"New requests are refused until the quota resets on {reset_day} (00:00 UTC)."
    else:
        subject = f"{name} has used {level} % of this month's characters"
        consequence = f"The quota resets on {reset_day} (00:00 UTC)."
    body = (
        f"{name} has used {used:,} of its {monthly:,} characters this month "
        f"({min(100, 100 * used // monthly) if monthly else 100} %).\n{consequence}\n\n"
        f"Usage by key, voice and member: {public_url_for('dashboard:usage')}\n"
    )
    return subject, body


def send_quota_mail(organization_id: Any, level: int, used: int, monthly: int, resets: dt.datetime) -> None:
    to = owner_addresses(organization_id)
    name = Organization.objects.filter(pk=organization_id).values_list("name", flat=True).first()
    if not to or name is None:
        return
    subject, body = message(name, level, used, monthly, resets)
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
    except Exception:  # any backend's failure: logged, the settlement it follows stands
        log.exception("quota mail to the owners of %s not sent", organization_id)


def on_settlement(event: events.JobEnded | events.JobSettled) -> None:
    """After the commit of a settlement that crossed quota levels: one mail, for the highest."""
    settlement = event.settlement
    if settlement is None or not settlement.levels:
        return
    send_quota_mail(
        settlement.organization_id,
        max(settlement.levels),
        settlement.used,
        settlement.monthly,
        settlement.resets,
    )
