from django.urls import URLPattern, URLResolver, path

from webapp.speech.api import openai, openai_catalog, streaming, views, voices

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/voices", voices.VoiceCollectionView.as_view(), name="api-voices"),
    path("api/v1/voices/<str:voice_id>", views.VoiceDetailView.as_view(), name="api-voice-detail"),
    path("api/v1/speech", views.SpeechListView.as_view(), name="api-speech"),
    path("api/v1/speech/<str:job_id>", views.speech_detail, name="api-speech-detail"),
    path("api/v1/speech/<str:job_id>/audio", views.SpeechAudioView.as_view(), name="api-speech-audio"),
    path("api/v1/speech/<str:job_id>/stream", streaming.SpeechStreamView.as_view(), name="api-speech-stream"),
    path("api/v1/speech/<str:job_id>/cancel", views.SpeechCancelView.as_view(), name="api-speech-cancel"),
    path("api/v1/usage", views.UsageView.as_view(), name="api-usage"),
    path("api/v1/schema", views.PublicSchemaView.as_view(), name="api-schema"),
    path("api/docs", views.DocsView.as_view(), name="api-docs"),
    path("v1/audio/speech", openai.openai_speech, name="openai-speech"),
    path("v1/audio/voices", openai_catalog.OpenAIVoicesView.as_view(), name="openai-voices"),
    path("v1/models", openai_catalog.OpenAIModelsView.as_view(), name="openai-models"),
]
