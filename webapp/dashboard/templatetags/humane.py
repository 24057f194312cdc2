"""Numbers for people: thousands separators, sizes in KB/MB/GB, durations, and the quota banner."""

from __future__ import annotations

from typing import Any

from django import template

from webapp import humane
from webapp.dashboard.quota import quota_of

register = template.Library()

SIZE_UNITS = ("bytes", "KB", "MB", "GB", "TB")


@register.filter
def count(value: Any) -> str:
    """1234567 -> "1,234,567" (anything not a number as it is)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "" if value is None else str(value)


@register.filter
def size(value: Any) -> str:
    """Bytes in the largest unit under 1024 of the next: "512 bytes", "1.5 MB", "20 GB"."""
    try:
        n = float(value)
    except (TypeError, ValueError):
        return ""
    unit = 0
    while abs(n) >= 1024 and unit < len(SIZE_UNITS) - 1:
        n /= 1024
        unit += 1
    if unit == 0:
        return f"{int(n):,} bytes"
    return f"{n:.1f} {SIZE_UNITS[unit]}".replace(".0 ", " ")


@register.filter
def duration(value: Any) -> str:
    """Seconds as "0.8 s", "42 s", "3 min 05 s", "1 h 02 min", "3 d 01 h" (webapp.humane)."""
    try:
        return humane.duration(float(value))
    except (TypeError, ValueError):
        return ""


@register.inclusion_tag("dashboard/_quota_banner.html", takes_context=True)
def quota_banner(context: template.Context) -> dict[str, Any]:
    """At 80 % and 100 % of the month's characters, on every page of the tenant."""
    tenant = context.get("tenant")
    if tenant is None:
        return {"quota": None}
    return {"quota": quota_of(tenant.organization)}
