from django.urls import URLPattern, URLResolver

# Filled in by the API (issue 4): /api/v1/..., /api/docs, /v1/audio/speech.
urlpatterns: list[URLPattern | URLResolver] = []
