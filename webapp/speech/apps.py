from django.apps import AppConfig


class SpeechConfig(AppConfig):
    name = "webapp.speech"
    label = "speech"
    default_auto_field = "django.db.models.BigAutoField"
