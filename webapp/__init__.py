# Load the Celery app with Django, so tasks sent from web processes use our
# broker settings (without it shared_task falls back to Celery's default app).
from webapp.celery import app as celery_app

__all__ = ["celery_app"]
