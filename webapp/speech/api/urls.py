from django.urls import URLPattern, URLResolver, include, path

from webapp.speech.api import (
    consents,
    export,
    openai,
    openai_batch,
    openai_catalog,
    openai_voices,
    session_views,
    streaming,
    timestamps,
    views,
    voices,
)
from webapp.speech.api.cache import SentenceCacheView

# The sub-resources of one job: api/v1/speech/<job_id>/...
_job_routes: list[URLPattern | URLResolver] = [
    path("audio", views.SpeechAudioView.as_view(), name="api-speech-audio"),
    path("stream", streaming.SpeechStreamView.as_view(), name="api-speech-stream"),
    path("cancel", views.SpeechCancelView.as_view(), name="api-speech-cancel"),
    path("timestamps", timestamps.SpeechTimestampsView.as_view(), name="api-speech-timestamps"),
]
_v1_routes: list[URLPattern | URLResolver] = [
    path("voices", voices.VoiceCollectionView.as_view(), name="api-voices"),
    path("voices/<str:voice_id>", views.VoiceDetailView.as_view(), name="api-voice-detail"),
    path("voices/<str:voice_id>/consent", consents.VoiceConsentView.as_view(), name="api-voice-consent"),
    path("speech", views.SpeechListView.as_view(), name="api-speech"),
    path("speech/<str:job_id>", views.speech_detail, name="api-speech-detail"),
    path("speech/<str:job_id>/", include(_job_routes)),
    path("voice_consents", consents.ConsentCollectionView.as_view(), name="api-consents"),
    path("voice_consents/phrase", consents.ConsentPhraseView.as_view(), name="api-consent-phrase"),
    path("voice_consents/<str:consent_id>", consents.ConsentDetailView.as_view(), name="api-consent-detail"),
    path("sessions", session_views.SessionListView.as_view(), name="api-sessions"),
    path("sessions/<str:session_id>", session_views.SessionDetailView.as_view(), name="api-session-detail"),
    path("usage", views.UsageView.as_view(), name="api-usage"),
    path("organization/export", export.OrganizationExportView.as_view(), name="api-organization-export"),
    path("cache", SentenceCacheView.as_view(), name="api-sentence-cache"),
    path("schema", views.PublicSchemaView.as_view(), name="api-schema"),
]
# The OpenAI-compatible surface, at the paths OpenAI clients call.
_openai_routes: list[URLPattern | URLResolver] = [
    path("audio/speech", openai.openai_speech, name="openai-speech"),
    path("audio/speech/batch", openai_batch.openai_speech_batch, name="openai-speech-batch"),
    path("audio/voices", openai_voices.OpenAIVoicesView.as_view(), name="openai-voices"),
    path(
        "audio/voices/<str:name>", openai_voices.OpenAIVoiceDetailView.as_view(), name="openai-voice-detail"
    ),
    path("models", openai_catalog.OpenAIModelsView.as_view(), name="openai-models"),
    path("audio/voice_consents", consents.OpenAIConsentCollectionView.as_view(), name="openai-consents"),
    path("audio/voice_consents/phrase", consents.ConsentPhraseView.as_view(), name="openai-consent-phrase"),
    path(
        "audio/voice_consents/<str:consent_id>",
        consents.ConsentDetailView.as_view(),
        name="openai-consent-detail",
    ),
]

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/", include(_v1_routes)),
    path("api/docs", views.DocsView.as_view(), name="api-docs"),
    path("v1/", include(_openai_routes)),
]
