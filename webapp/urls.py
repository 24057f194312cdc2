from django.contrib import admin
from django.urls import include, path

from webapp.health import healthz
from webapp.metrics.views import metrics_view

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("webapp.speech.api.urls")),
    path("", include("webapp.tenants.api.urls")),
    path("", include("webapp.dashboard.urls")),
]
