"""The operators' admin site: Django's AdminSite with a second factor and pages of our own.

Installed as Django's default site (``webapp.admin_config.OperatorAdminConfig``
in INSTALLED_APPS replaces ``django.contrib.admin``), so ``admin.site`` and ``@admin.register``
refer to it. When ``TTS_ADMIN_REQUIRE_OTP`` is on, only staff verified by a
TOTP device (django-otp) get in, and the login form asks for the code; staff
enrol with ``manage.py enroll_totp <username>``. Failed logins are counted by
django-axes, which locks the (user name, address) pair out after
``TTS_LOGIN_FAILURE_LIMIT``, and slowed down per user name (``webapp.login_guard``).

Apps add pages that are not models (the Workers page) with :meth:`add_page`
instead of patching the site.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from django import forms
from django.conf import settings
from django.contrib.admin import AdminSite
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path, reverse
from django_otp.admin import OTPAdminAuthenticationForm
from django_otp.models import Device
from django_otp.plugins.otp_totp.models import TOTPDevice

from webapp import login_guard

View = Callable[..., HttpResponse]


@dataclass(frozen=True)
class AdminPage:
    """A page listed under an app on the index and in the sidebar, like a model."""

    app_label: str
    route: str
    view: View
    name: str
    title: str
    visible: Callable[[HttpRequest], bool]


def otp_required() -> bool:
    return bool(getattr(settings, "TTS_ADMIN_REQUIRE_OTP", False))


class OperatorLoginForm(OTPAdminAuthenticationForm):
    """User name, password and the authenticator's code, checked in one submission.

    django-otp's form asks the operator to pick a device, and lists the devices
    only after a first, failed submission. An operator has one authenticator
    (``manage.py enroll_totp``), so without a choice the form uses the user's
    confirmed TOTP device; a device named in ``otp_device`` (django-otp's own
    field, still accepted) must be theirs, as django-otp checks. The password is
    checked first, through django-axes (the lockout and slow-down rules); a
    wrong code after the right password counts as a failed log-in for the same
    rules, so the code cannot be guessed faster than a password.
    """

    otp_token = forms.CharField(
        required=False,
        label="Authentication code",
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "autocapitalize": "none"}
        ),
    )

    def _chosen_device(self, user: Any) -> Device | None:
        chosen: Device | None = super()._chosen_device(user)
        if chosen is not None:
            return chosen
        device: Device | None = (
            TOTPDevice.objects.filter(user_id=user.pk, confirmed=True).order_by("pk").first()
        )
        if device is None:
            raise forms.ValidationError(
                "This account has no authenticator yet; an operator enrols one with manage.py enroll_totp.",
                code="no_device",
            )
        return device

    def clean_otp(self, user: Any) -> None:
        try:
            super().clean_otp(user)
        except forms.ValidationError:
            if user is not None and self.cleaned_data.get("otp_token"):
                user_login_failed.send(
                    sender=type(self),
                    credentials={"username": self.cleaned_data.get("username")},
                    request=self.request,
                )
            raise


class OperatorAdminSite(AdminSite):
    site_header = "TTS service administration"
    site_title = "TTS service admin"
    index_title = "Operations"

    def __init__(self, name: str = "admin") -> None:
        super().__init__(name)
        self._pages: list[AdminPage] = []

    # ------------------------------------------------------------------ login

    def has_permission(self, request: HttpRequest) -> bool:
        """Active staff; with TTS_ADMIN_REQUIRE_OTP also verified by a TOTP device in this session."""
        if not super().has_permission(request):
            return False
        return not otp_required() or bool(request.user.is_verified())  # type: ignore[union-attr]

    # Properties, read on each login: the site is shared by every thread, and a
    # test that turns the setting on must see the second factor at once.
    @property
    def login_form(self) -> type[AdminAuthenticationForm]:  # type: ignore[override]
        return OperatorLoginForm if otp_required() else AdminAuthenticationForm

    @property
    def login_template(self) -> str:  # type: ignore[override]
        return "admin/operator_login.html" if otp_required() else "admin/login.html"

    # ------------------------------------------------------------------ pages

    def add_page(
        self,
        app_label: str,
        route: str,
        view: View,
        *,
        name: str,
        title: str,
        visible: Callable[[HttpRequest], bool],
    ) -> None:
        """Serve ``view`` at ``<admin>/<route>`` (staff only) and list it under ``app_label`` for whom ``visible``."""
        self._pages.append(AdminPage(app_label, route, view, name, title, visible))

    def get_urls(self) -> list[URLPattern | URLResolver]:
        # Before the site's own patterns: its final catch-all would answer 404 otherwise.
        own = [path(page.route, self.admin_view(page.view), name=page.name) for page in self._pages]
        return [*own, *super().get_urls()]

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        app_list = super().get_app_list(request, app_label)
        for app in app_list:
            pages = [page for page in self._pages if page.app_label == app["app_label"]]
            for page in pages:
                if page.visible(request):
                    app["models"].append(self._page_entry(page))
            if pages:
                app["models"].sort(key=lambda entry: str(entry["name"]))
        return app_list

    def _page_entry(self, page: AdminPage) -> dict[str, Any]:
        return {
            "name": page.title,
            "object_name": page.title.replace(" ", ""),
            "perms": {"add": False, "change": False, "delete": False, "view": True},
            "admin_url": reverse(f"{self.name}:{page.name}", current_app=self.name),
            "add_url": None,
            "view_only": True,
        }


site = OperatorAdminSite()


def default_site() -> OperatorAdminSite:
    """What ``django.contrib.admin.site`` resolves to: the one instance above."""
    return site


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' check, then the user name's slow-down, for logins that come with a request
    (every web login form passes one; webapp/login_guard.py says the rules).

    Without a request (the test client's ``login()``, a shell) there is no
    client to count or lock out; django-axes would raise instead. A slowed-down
    attempt is refused as django-axes refuses a locked-out one (its middleware
    answers with ``login_guard.lockout_response``), and, like it, not counted.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is None:
            return None
        super().authenticate(request, username, password, **kwargs)
        wait = login_guard.slowdown_wait(request, username)
        if wait is not None:
            request.login_retry_after = wait  # type: ignore[attr-defined]
            request.axes_locked_out = True  # type: ignore[attr-defined]
            raise AxesBackendPermissionDenied("AxesBackend: this user name is slowed down from this address")
        return None
