"""Account chores of the dashboard: e-mail links, verification, the mail budgets, TOTP, sessions.

Links in e-mails are signed (``django.core.signing``) and carry what they
change, so nothing is stored until a person follows one (an invitation's link
carries the secret of its pending row instead). Mails are counted per
recipient and per client address (``mail_allowed``). A change to how an
account signs in (its e-mail, password or second factor) asks for the
password again (``reauthenticate``), is audited, and ends the account's other
sessions (``end_other_sessions``).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.core import signing
from django.core.cache import cache
from django.core.mail import send_mail
from django.db import transaction
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils import timezone
from django_otp import match_token
from django_otp.plugins.otp_totp.models import TOTPDevice
from redis.exceptions import RedisError

from webapp import redis_clients
from webapp.audit import services as audit
from webapp.dashboard.models import Account, RecoveryCode, RecoveryCodes, recovery_code_digest
from webapp.public_urls import public_url_for
from webapp.tenants import hourly
from webapp.tenants.accounts import find_user_by_email
from webapp.tenants.models import Invitation

log = logging.getLogger(__name__)

LINK_MAX_AGE = 3 * 24 * 3600
VERIFY_SALT = "dashboard.verify-email"
CHANGE_SALT = "dashboard.change-email"
RECOVERY_CODES = 10
# What a refused mail (``mail_allowed``) answers, the same for every address.
MAIL_REFUSED = (
    "Too many e-mails were asked for this address or from your network in the last hour; try again later."
)


class LinkError(Exception):
    """A link that is malformed, tampered with or too old."""


def client_ip(request: HttpRequest) -> str:
    return str(request.META.get(settings.TTS_CLIENT_IP_HEADER) or request.META.get("REMOTE_ADDR") or "")


def signup_allowed(request: HttpRequest) -> bool:
    """At most TTS_SIGNUP_PER_IP_HOURLY sign-ups per client IP per clock hour (counted in Redis)."""
    return hourly.spend([(f"signup:ip:{client_ip(request)}", settings.TTS_SIGNUP_PER_IP_HOURLY)])


def mail_allowed(request: HttpRequest, address: str) -> bool:
    """One more account mail to ``address`` asked from this client: within both hourly budgets?

    Counted whether or not the address has an account, so a refusal tells nothing about it.
    """
    return hourly.spend(
        [
            (f"mail:to:{address.strip().lower()}", settings.TTS_ACCOUNT_MAILS_PER_ADDRESS_HOURLY),
            (f"mail:ip:{client_ip(request)}", settings.TTS_ACCOUNT_MAILS_PER_IP_HOURLY),
        ]
    )


def _mail(to: str, subject: str, template: str, context: dict[str, Any]) -> None:
    body = render_to_string(f"dashboard/mail/{template}", context)
    send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [to])


def _link(request: HttpRequest, name: str, token: str) -> str:
    # From TTS_PUBLIC_ORIGIN, never the request's Host: the mail must point at the site.
    return public_url_for(name, token)


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
    """Mail the new address a link; an address another account uses gets a notice instead.

    The page answers the same either way: only the owner of the new address
    learns that it is taken.
    """
    audit.record("account.email_change_requested", target=user, actor=user, details={"to": new_email})
    if find_user_by_email(new_email) is not None:
        _mail(new_email, "Your e-mail address is already in use", "email_taken.txt", {})
        return
    token = signing.dumps({"u": user.pk, "old": user.email, "e": new_email}, salt=CHANGE_SALT)
    link = _link(request, "dashboard:confirm-email-change", token)
    _mail(new_email, "Confirm your new e-mail address", "change_email.txt", {"link": link, "user": user})


@transaction.atomic(durable=True)
def _change_email(data: dict[str, Any]) -> Any:
    user = get_user_model().objects.select_for_update().filter(pk=data["u"], email=data["old"]).first()
    if user is None:
        raise LinkError("This link was already used or the address changed since.")
    if get_user_model().objects.filter(email__iexact=data["e"]).exclude(pk=user.pk).exists():
        raise LinkError("This link can no longer be used.")
    user.email = user.username = data["e"]
    user.save(update_fields=["email", "username"])
    Account.objects.filter(user=user).update(email_verified_at=timezone.now())
    audit.record("account.email_changed", target=user, actor=user, details={"from": data["old"]})
    return user


def confirm_email_change(token: str) -> Any:
    """Change the address as the link says and tell the old address; returns the user."""
    data = _load(token, CHANGE_SALT)
    user = _change_email(data)
    _mail(data["old"], "Your e-mail address was changed", "email_changed.txt", {"new": user.email})
    return user


def send_invitation(request: HttpRequest, invitation: Invitation, raw: str) -> None:
    """The invitation's link, and fixed words only: nothing the inviter typed (not even the
    organisation's name) goes into the mail; the page behind the link shows who invited to what."""
    link = _link(request, "dashboard:invitation", raw)
    days = settings.TTS_INVITATION_DAYS
    _mail(invitation.email, "You are invited to the TTS service", "invite.txt", {"link": link, "days": days})


# ------------------------------------------------------------------ re-authentication and sessions


def reauthenticate(request: HttpRequest, password: str, code: str = "") -> tuple[str, str] | None:
    """Check the signed-in person's password (and a current code when they use a second factor).

    The password goes through ``authenticate`` with the request, so wrong ones
    count towards the same lockout as the log-in form's. Returns the field
    that is wrong and why, or None.
    """
    user: Any = request.user
    if authenticate(request, username=user.get_username(), password=password) is None:
        return "password", "That password is not right."
    if confirmed_totp(user) is not None and match_token(user, code.strip()) is None:
        return "code", "That code is not right; codes change every 30 seconds."
    return None


def _sessions_key(user_pk: Any) -> str:
    return cache.make_key(f"dashboard:sessions:{user_pk}")


def remember_session(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """``user_logged_in``: note the new session's key, so a security change can end it later.

    The set lives as long as a session can; a lost one (Redis down) only means
    those sessions are not ended early, never a failed log-in.
    """
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if not session_key:
        return
    try:
        client = redis_clients.cache()
        key = _sessions_key(user.pk)
        client.sadd(key, session_key)
        client.expire(key, settings.SESSION_COOKIE_AGE)
    except RedisError as exc:
        log.warning("could not note the session of user %s: %s", user.pk, exc)


def end_other_sessions(request: HttpRequest, user: Any) -> int:
    """End every session of ``user`` but this request's. Returns how many were ended."""
    current = request.session.session_key if getattr(request.user, "pk", None) == user.pk else None
    engine: type[SessionBase] = type(request.session)
    try:
        client = redis_clients.cache()
        key = _sessions_key(user.pk)
        others = [k.decode() if isinstance(k, bytes) else str(k) for k in client.smembers(key)]
        others = [k for k in others if k != current]
        for session_key in others:
            engine(session_key).delete()
        if others:
            client.srem(key, *others)
    except RedisError as exc:
        log.error("could not end the other sessions of user %s: %s", user.pk, exc)
        return 0
    return len(others)


# ------------------------------------------------------------------ TOTP


def confirmed_totp(user: Any) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


def pending_totp(user: Any) -> TOTPDevice:
    """The device being enrolled (unconfirmed until the person types a code from it)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).first()
    return device or TOTPDevice.objects.create(user=user, name="Authenticator app", confirmed=False)


@transaction.atomic(durable=True)
def confirm_totp(user: Any, code: str) -> list[str] | None:
    """Confirm the pending device with a code; returns the recovery codes (shown once) or None."""
    device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).first()
    if device is None or not device.verify_token(code.strip()):
        return None
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    codes = _new_recovery_codes(user)
    audit.record("account.totp_enabled", target=user, actor=user)
    return codes


def _new_recovery_codes(user: Any) -> list[str]:
    """Inside the caller's transaction: a new set replaces the old; returns the codes (kept as digests only)."""
    RecoveryCodes.objects.filter(user=user).delete()
    device = RecoveryCodes.objects.create(
        user=user, name="Recovery codes", confirmed=True, salt=secrets.token_hex(16)
    )
    codes = [secrets.token_hex(5) for _ in range(RECOVERY_CODES)]
    digests = {recovery_code_digest(c, device.salt, device.iterations) for c in codes}
    RecoveryCode.objects.bulk_create([RecoveryCode(device=device, digest=d) for d in digests])
    return codes


@transaction.atomic(durable=True)
def remove_second_factor(user: Any) -> None:
    TOTPDevice.objects.filter(user=user).delete()
    RecoveryCodes.objects.filter(user=user).delete()
    audit.record("account.totp_disabled", target=user, actor=user)
