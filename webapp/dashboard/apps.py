from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in


class DashboardConfig(AppConfig):
    name = "webapp.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # Every log-in (the dashboard's, the admin's) notes its session, so a change to how the
        # account signs in can end the others (accounts.end_other_sessions). Imported here, once
        # the app registry is ready: accounts imports models.
        from webapp.dashboard import accounts

        user_logged_in.connect(accounts.remember_session, dispatch_uid="dashboard.remember_session")
