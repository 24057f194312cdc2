"""Account chores of the dashboard: e-mail links, verification, the sign-up throttle, TOTP.

Links in e-mails are signed (``django.core.signing``) and carry what they
change, so nothing is stored until a person follows one.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core import signing
from django.core.cache import cache
from django.core.mail import send_mail
from django.db import transaction
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp.dashboard.models import Account

LINK_MAX_AGE = 3 * 24 * 3600
VERIFY_SALT = "dashboard.verify-email"
CHANGE_SALT = "dashboard.change-email"
RECOVERY_CODES = 10


class LinkError(Exception):
    """A link that is malformed, tampered with or too old."""


def client_ip(request: HttpRequest) -> str:
    return str(request.META.get(settings.TTS_CLIENT_IP_HEADER) or request.META.get("REMOTE_ADDR") or "")


def signup_allowed(request: HttpRequest) -> bool:
    """At most TTS_SIGNUP_PER_IP_HOURLY sign-ups per client IP per clock hour (counted in Redis)."""
    key = f"dashboard:signup:{client_ip(request)}:{int(time.time() // 3600)}"
    cache.add(key, 0, timeout=3600)
    return int(cache.incr(key)) <= settings.TTS_SIGNUP_PER_IP_HOURLY


def _mail(to: str, subject: str, template: str, context: dict[str, Any]) -> None:
    body = render_to_string(f"dashboard/mail/{template}", context)
    send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [to])


def _link(request: HttpRequest, name: str, token: str) -> str:
    return request.build_absolute_uri(reverse(name, args=[token]))


def needs_verification(user: Any) -> bool:
    return Account.objects.filter(user_id=user.pk, email_verified_at__isnull=True).exists()


def start_verification(request: HttpRequest, user: Any) -> None:
    Account.objects.get_or_create(user=user)
    token = signing.dumps({"u": user.pk, "e": user.email}, salt=VERIFY_SALT)
    link = _link(request, "dashboard:verify-email", token)
    _mail(user.email, "Confirm your e-mail address", "verify.txt", {"link": link, "user": user})


def _load(token: str, salt: str) -> dict[str, Any]:
    try:
        return dict(signing.loads(token, salt=salt, max_age=LINK_MAX_AGE))
    except signing.BadSignature as exc:
        raise LinkError("This link is invalid or has expired.") from exc


def confirm_email(token: str) -> Any:
    """Mark the address in the link verified; returns the user."""
    data = _load(token, VERIFY_SALT)
    user = get_user_model().objects.filter(pk=data["u"], email=data["e"]).first()
    if user is None:
        raise LinkError("This link is for an address the account no longer has.")
    Account.objects.update_or_create(user=user, defaults={"email_verified_at": timezone.now()})
    return user


def start_email_change(request: HttpRequest, user: Any, new_email: str) -> None:
    token = signing.dumps({"u": user.pk, "old": user.email, "e": new_email}, salt=CHANGE_SALT)
    link = _link(request, "dashboard:confirm-email-change", token)
    _mail(new_email, "Confirm your new e-mail address", "change_email.txt", {"link": link, "user": user})


@transaction.atomic
def confirm_email_change(token: str) -> Any:
    data = _load(token, CHANGE_SALT)
    user = get_user_model().objects.select_for_update().filter(pk=data["u"], email=data["old"]).first()
    if user is None:
        raise LinkError("This link was already used or the address changed since.")
    if get_user_model().objects.filter(email__iexact=data["e"]).exclude(pk=user.pk).exists():
        raise LinkError("Another account uses this address now.")
    user.email = user.username = data["e"]
    user.save(update_fields=["email", "username"])
    Account.objects.filter(user=user).update(email_verified_at=timezone.now())
    return user


def send_invitation(request: HttpRequest, user: Any, organization: Any, invited_by: Any) -> None:
    """An invited person sets a password through the password-reset page (proving the address)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    path = reverse("dashboard:password-reset-confirm", args=[uid, default_token_generator.make_token(user)])
    context = {"link": request.build_absolute_uri(path), "organization": organization, "by": invited_by}
    _mail(user.email, f"You are invited to {organization.name}", "invite.txt", context)


# ------------------------------------------------------------------ TOTP


def confirmed_totp(user: Any) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


def pending_totp(user: Any) -> TOTPDevice:
    """The device being enrolled (unconfirmed until the person types a code from it)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).first()
    return device or TOTPDevice.objects.create(user=user, name="Authenticator app", confirmed=False)


@transaction.atomic
def confirm_totp(user: Any, code: str) -> list[str] | None:
    """Confirm the pending device with a code; returns the recovery codes (shown once) or None."""
    device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).first()
    if device is None or not device.verify_token(code.strip()):
        return None
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    StaticDevice.objects.filter(user=user).delete()
    static = StaticDevice.objects.create(user=user, name="Recovery codes", confirmed=True)
    codes = [secrets.token_hex(5) for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create([StaticToken(device=static, token=c) for c in codes])
    return codes


@transaction.atomic
def remove_second_factor(user: Any) -> None:
    TOTPDevice.objects.filter(user=user).delete()
    StaticDevice.objects.filter(user=user).delete()
