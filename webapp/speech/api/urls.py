from django.urls import URLPattern, URLResolver, path
from drf_spectacular.views import SpectacularAPIView

from webapp.speech.api import openai, views


class PublicSchemaView(SpectacularAPIView):
    """The schema is public: it describes the API, holds no tenant data."""

    authentication_classes: list[type] = []
    permission_classes: list[type] = []


urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/voices", views.VoiceListView.as_view(), name="api-voices"),
    path("api/v1/voices/<str:voice_id>", views.VoiceDetailView.as_view(), name="api-voice-detail"),
    path("api/v1/speech", views.SpeechListView.as_view(), name="api-speech"),
    path("api/v1/speech/<str:job_id>", views.SpeechDetailView.as_view(), name="api-speech-detail"),
    path("api/v1/speech/<str:job_id>/audio", views.SpeechAudioView.as_view(), name="api-speech-audio"),
    path("api/v1/speech/<str:job_id>/cancel", views.SpeechCancelView.as_view(), name="api-speech-cancel"),
    path("api/v1/usage", views.UsageView.as_view(), name="api-usage"),
    path("api/v1/schema", PublicSchemaView.as_view(), name="api-schema"),
    path("api/docs", views.docs_page, name="api-docs"),
    path("v1/audio/speech", openai.OpenAISpeechView.as_view(), name="openai-speech"),
]
