"""Django's admin app with our site as the default one.

Its own module: an AppConfig is imported while the app registry loads, before
anything that touches models (the site's login forms) may be imported.
"""

from django.contrib.admin.apps import AdminConfig


class OperatorAdminConfig(AdminConfig):
    default_site = "webapp.admin_site.default_site"
