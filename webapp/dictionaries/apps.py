from django.apps import AppConfig


class DictionariesConfig(AppConfig):
    name = "webapp.dictionaries"
    label = "dictionaries"
    default_auto_field = "django.db.models.BigAutoField"
