from django.urls import URLPattern, path

from webapp.dashboard.views import account, invitations, people, public, speech, voices

app_name = "dashboard"

urlpatterns: list[URLPattern] = [
    path("", public.home, name="home"),
    # Nginx's strict "login" zone covers POSTs to accounts/login, accounts/signup and accounts/password/reset.
    path("accounts/signup/", public.signup, name="signup"),
    path("accounts/login/", public.LoginView.as_view(), name="login"),
    path("accounts/login/code/", public.login_code, name="login-code"),
    path("accounts/logout/", public.logout, name="logout"),
    path("accounts/password/reset/", public.password_reset, name="password-reset"),
    path("accounts/password/reset/sent/", public.password_reset_done, name="password-reset-done"),
    path(
        "accounts/password/set/<uidb64>/<token>/",
        public.password_reset_confirm,
        name="password-reset-confirm",
    ),
    path("accounts/password/done/", public.password_reset_complete, name="password-reset-complete"),
    path("accounts/verify/<str:token>/", public.verify_email, name="verify-email"),
    path("accounts/email/<str:token>/", public.confirm_email_change, name="confirm-email-change"),
    path("accounts/invitation/<str:token>/", invitations.invitation, name="invitation"),
    path("app/account/", account.account, name="account"),
    path("app/account/verify/", account.resend_verification, name="resend-verification"),
    path("app/account/organization/", account.switch_organization, name="switch-organization"),
    path("app/account/security/", account.security, name="security"),
    path("app/account/security/off/", account.security_disable, name="security-disable"),
    path("app/synthesize/", speech.synthesize, name="synthesize"),
    path("app/jobs/", speech.submit, name="job-submit"),
    path("app/jobs/<uuid:job_id>/", speech.job_status, name="job-status"),
    path("app/jobs/<uuid:job_id>/cancel/", speech.job_cancel, name="job-cancel"),
    path("app/jobs/<uuid:job_id>/audio/", speech.job_audio, name="job-audio"),
    path("app/jobs/<uuid:job_id>/delete/", speech.job_delete, name="job-delete"),
    path("app/jobs/<uuid:job_id>/captions/", speech.job_captions, name="job-captions"),
    path("app/history/", speech.history, name="history"),
    path("app/voices/", voices.voices, name="voices"),
    path("app/voices/upload/", voices.voice_upload, name="voice-upload"),
    path("app/voices/<uuid:pk>/delete/", voices.voice_delete, name="voice-delete"),
    path("app/usage/", speech.usage, name="usage"),
    path("app/usage/export.csv", speech.usage_export, name="usage-export"),
    path("app/keys/", people.keys, name="keys"),
    path("app/keys/<uuid:key_id>/revoke/", people.revoke_key, name="key-revoke"),
    path("app/keys/<uuid:key_id>/rotate/", people.rotate_key, name="key-rotate"),
    path("app/members/", people.members, name="members"),
    path("app/members/<int:pk>/role/", people.member_role, name="member-role"),
    path("app/members/<int:pk>/remove/", people.member_remove, name="member-remove"),
    path(
        "app/members/invitations/<uuid:pk>/withdraw/",
        people.invitation_withdraw,
        name="invitation-withdraw",
    ),
]
