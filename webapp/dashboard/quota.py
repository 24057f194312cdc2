"""Where a tenant stands against its monthly characters: the usage page, the synthesize page and the banner."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from webapp.speech.models import UsagePeriod
from webapp.speech.services.ledger import highest_level, period_end, period_start
from webapp.tenants.models import Organization


@dataclass(frozen=True)
class Quota:
    used: int
    reserved: int
    limit: int
    resets_at: dt.datetime  # the next period's start, 00:00 UTC

    @property
    def taken(self) -> int:
        """What a submit is checked against: charged plus reserved by jobs not yet settled."""
        return self.used + self.reserved

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.taken)

    @property
    def percent(self) -> int:
        if self.limit <= 0:
            return 100
        # Rounded down: "100 %" only when nothing is left.
        return min(100, 100 * self.taken // self.limit)

    @property
    def level(self) -> int:
        """The highest quota level reached (0: none), for the banner."""
        return highest_level(self.percent)


def quota_of(organization: Organization, now: dt.datetime | None = None) -> Quota:
    now = now or timezone.now()
    row = (
        UsagePeriod.objects.filter(organization=organization, period=period_start(now))
        .values_list("characters_used", "characters_reserved")
        .first()
    )
    used, reserved = row or (0, 0)
    return Quota(int(used), int(reserved), organization.plan.monthly_characters, period_end(now))
