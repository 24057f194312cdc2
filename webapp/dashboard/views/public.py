"""Pages for everyone: the front door, sign-up, log in (with a second factor), e-mail links."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login
from django_otp import match_token

from webapp.audit import services as audit
from webapp.dashboard import accounts
from webapp.dashboard.access import error_text
from webapp.dashboard.forms import CodeForm, LoginForm, SignUpForm
from webapp.errors import DomainError
from webapp.public_urls import public_origin
from webapp.tenants.accounts import sign_up

PENDING_USER = "dashboard_pending_user"
PENDING_BACKEND = "dashboard_pending_backend"
PENDING_FAILURES = "dashboard_pending_failures"
MAX_CODE_FAILURES = 5
# The backend a session names once the person is known (sign-up, second step).
PASSWORD_BACKEND = "django.contrib.auth.backends.ModelBackend"


def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("dashboard:synthesize")
    return render(request, "dashboard/home.html", _front_door())


def _front_door() -> dict[str, Any]:
    """Whether anyone may sign up and, if not, the operator's line on whom to ask."""
    return {"signup_open": settings.TTS_SIGNUP == "open", "signup_contact": settings.TTS_SIGNUP_CONTACT}


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if settings.TTS_SIGNUP != "open":
        return render(request, "dashboard/signup_closed.html", _front_door(), status=403)
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if not accounts.signup_allowed(request):
            form.add_error(None, "Too many sign-ups from your network in the last hour; try again later.")
            return render(request, "dashboard/signup.html", {"form": form}, status=429)
        try:
            user, _ = sign_up(
                email=form.cleaned_data["email"],
                password=form.cleaned_data["password"],
                organization_name=form.cleaned_data["organization"],
            )
        except DomainError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, error_text(exc))
        else:
            accounts.start_verification(request, user)
            login(request, user, backend=PASSWORD_BACKEND)
            messages.success(request, f"Welcome! We sent a confirmation link to {user.email}.")
            return redirect("dashboard:account")
    return render(request, "dashboard/signup.html", {"form": form})


def verify_email(request: HttpRequest, token: str) -> HttpResponse:
    try:
        accounts.confirm_email(token)
    except accounts.LinkError as exc:
        return render(request, "dashboard/link_error.html", {"error": str(exc)}, status=400)
    messages.success(request, "Your e-mail address is confirmed.")
    return redirect("dashboard:synthesize" if request.user.is_authenticated else "dashboard:login")


def confirm_email_change(request: HttpRequest, token: str) -> HttpResponse:
    try:
        user = accounts.confirm_email_change(token)
    except accounts.LinkError as exc:
        return render(request, "dashboard/link_error.html", {"error": str(exc)}, status=400)
    accounts.end_other_sessions(request, user)
    messages.success(request, f"Your e-mail address is now {user.email}.")
    return redirect("dashboard:account" if request.user.is_authenticated else "dashboard:login")


class LoginView(auth_views.LoginView):
    """Password first (Django's form, so the lockout of repeated failures applies), then a code if enrolled."""

    template_name = "dashboard/login.html"
    form_class = LoginForm
    redirect_authenticated_user = True

    def form_valid(self, form: Any) -> HttpResponse:
        user = form.get_user()
        if accounts.confirmed_totp(user) is None:
            return super().form_valid(form)
        self.request.session[PENDING_USER] = user.pk
        self.request.session[PENDING_BACKEND] = user.backend
        self.request.session[PENDING_FAILURES] = 0
        return redirect(f"{reverse_lazy('dashboard:login-code')}?next={self.get_success_url()}")


@require_http_methods(["GET", "POST"])
def login_code(request: HttpRequest) -> HttpResponseBase:
    user_pk = request.session.get(PENDING_USER)
    user = get_user_model().objects.filter(pk=user_pk).first() if user_pk else None
    if user is None:
        return redirect("dashboard:login")
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        device = match_token(user, form.cleaned_data["code"].strip())
        if device is not None:
            backend = request.session.pop(PENDING_BACKEND, PASSWORD_BACKEND)
            request.session.pop(PENDING_USER, None)
            login(request, user, backend=backend)
            otp_login(request, device)
            return redirect(_safe_next(request))
        failures = int(request.session.get(PENDING_FAILURES, 0)) + 1
        request.session[PENDING_FAILURES] = failures
        if failures >= MAX_CODE_FAILURES:
            request.session.pop(PENDING_USER, None)
            messages.error(request, "Too many wrong codes; sign in again.")
            return redirect("dashboard:login")
        form.add_error("code", "That code is not right; codes change every 30 seconds.")
    return render(request, "dashboard/login_code.html", {"form": form})


def _safe_next(request: HttpRequest) -> str:
    target = request.GET.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return str(reverse_lazy("dashboard:synthesize"))


logout = auth_views.LogoutView.as_view()


class PublicLinkPasswordResetView(auth_views.PasswordResetView):
    """Reset mails within the account-mail budgets, their link from TTS_PUBLIC_ORIGIN (never the Host)."""

    def form_valid(self, form: Any) -> HttpResponse:
        # Counted per address and per client whether or not the address has an account: a
        # refusal tells nothing about it, and nobody fills a mailbox with reset mails.
        if not accounts.mail_allowed(self.request, form.cleaned_data["email"]):
            form.add_error(None, accounts.MAIL_REFUSED)
            return self.render_to_response(self.get_context_data(form=form), status=429)
        self.extra_email_context = {**(self.extra_email_context or {}), "origin": public_origin()}
        return super().form_valid(form)


class AuditedPasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """A new password through a reset link: audited, and every session of the account ends
    (the new password's hash ends them on their next request anyway; this removes them now)."""

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        audit.record("account.password_changed", target=form.user, actor=form.user)
        accounts.end_other_sessions(self.request, form.user)
        return response


password_reset = PublicLinkPasswordResetView.as_view(
    template_name="dashboard/password_reset.html",
    email_template_name="dashboard/mail/password_reset.txt",
    subject_template_name="dashboard/mail/password_reset_subject.txt",
    success_url=reverse_lazy("dashboard:password-reset-done"),
)
password_reset_done = auth_views.PasswordResetDoneView.as_view(
    template_name="dashboard/password_reset_done.html"
)
password_reset_confirm = AuditedPasswordResetConfirmView.as_view(
    template_name="dashboard/password_reset_confirm.html",
    success_url=reverse_lazy("dashboard:password-reset-complete"),
)
password_reset_complete = auth_views.PasswordResetCompleteView.as_view(
    template_name="dashboard/password_reset_complete.html"
)
