from django.apps import AppConfig


class HousekeepingConfig(AppConfig):
    name = "webapp.housekeeping"
    label = "housekeeping"
    default_auto_field = "django.db.models.BigAutoField"
