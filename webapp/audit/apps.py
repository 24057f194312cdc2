from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "webapp.audit"
    label = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The request id travels in every Celery message this process sends and
        # is bound again in the worker that runs it.
        from webapp.audit import context

        context.connect_celery_signals()
