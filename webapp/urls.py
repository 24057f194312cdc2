from django.contrib import admin
from django.urls import include, path

from webapp.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("", include("webapp.speech.api.urls")),
    path("", include("webapp.tenants.api.urls")),
    path("", include("webapp.dashboard.urls")),
]
