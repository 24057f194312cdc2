from django.urls import URLPattern, path

from webapp.tenants.api import views

urlpatterns: list[URLPattern] = [
    path("api/v1/keys", views.KeyListView.as_view(), name="api-keys"),
    path("api/v1/keys/<str:key_id>", views.KeyDetailView.as_view(), name="api-key-detail"),
    path("api/v1/keys/<str:key_id>/rotate", views.KeyRotateView.as_view(), name="api-key-rotate"),
]
