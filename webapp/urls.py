from django.contrib import admin
from django.urls import include, path

from webapp.health import healthz, healthz_live, healthz_ready
from webapp.metrics.views import metrics_view

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("healthz/ready", healthz_ready, name="healthz_ready"),
    path("healthz/live", healthz_live, name="healthz_live"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("webapp.speech.api.urls")),
    path("", include("webapp.tenants.api.urls")),
    path("", include("webapp.dictionaries.api.urls")),
    path("", include("webapp.webhooks.urls")),
    path("", include("webapp.dashboard.urls")),
]
