from django.urls import URLPattern, path

from webapp.webhooks import views

urlpatterns: list[URLPattern] = [
    path("api/v1/webhooks", views.EndpointListView.as_view(), name="api-webhooks"),
    # Before the endpoint's own routes, which would take these names for endpoint ids.
    path("api/v1/webhooks/job-secret", views.JobSecretView.as_view(), name="api-webhook-job-secret"),
    path("api/v1/webhooks/deliveries", views.DeliveryListView.as_view(), name="api-webhook-deliveries"),
    path(
        "api/v1/webhooks/deliveries/<str:delivery_id>/redeliver",
        views.RedeliverView.as_view(),
        name="api-webhook-redeliver",
    ),
    path("api/v1/webhooks/<str:endpoint_id>", views.EndpointDetailView.as_view(), name="api-webhook-detail"),
    path(
        "api/v1/webhooks/<str:endpoint_id>/rotate-secret",
        views.RotateSecretView.as_view(),
        name="api-webhook-rotate",
    ),
    path("api/v1/webhooks/<str:endpoint_id>/ping", views.PingView.as_view(), name="api-webhook-ping"),
    path(
        "api/v1/webhooks/<str:endpoint_id>/deliveries",
        views.EndpointDeliveriesView.as_view(),
        name="api-webhook-endpoint-deliveries",
    ),
]
