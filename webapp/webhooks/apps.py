from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webapp.webhooks"
    label = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The service's events become outbox messages (webapp/webhooks/subscriptions.py); imported
        # here, once the app registry is ready, as Django loads every app's models first.
        from webapp.webhooks import subscriptions

        subscriptions.subscribe()
