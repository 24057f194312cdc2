from django.urls import URLPattern, path

from webapp.dictionaries.api import views

urlpatterns: list[URLPattern] = [
    path("api/v1/dictionaries", views.DictionaryListView.as_view(), name="api-dictionaries"),
    path(
        "api/v1/dictionaries/<str:dictionary_id>",
        views.DictionaryDetailView.as_view(),
        name="api-dictionary-detail",
    ),
    path(
        "api/v1/dictionaries/<str:dictionary_id>/versions",
        views.VersionListView.as_view(),
        name="api-dictionary-versions",
    ),
    path(
        "api/v1/dictionaries/<str:dictionary_id>/versions/<int:number>",
        views.VersionDetailView.as_view(),
        name="api-dictionary-version",
    ),
]
