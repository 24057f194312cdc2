from django.apps import AppConfig


class SpeechConfig(AppConfig):
    name = "webapp.speech"
    label = "speech"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The owners' quota e-mail reads the levels a settlement crossed, once it committed;
        # imported here, once the app registry is ready.
        from webapp.speech import voices
        from webapp.speech.services import events, quota_mail

        events.subscribe(events.JobEnded, quota_mail.on_settlement, after_commit=True)
        # A request's reference audio (ref_audio) is deleted once its job ended.
        events.subscribe(events.JobEnded, voices.one_off_job_ended, after_commit=True)
        events.subscribe(events.JobSettled, quota_mail.on_settlement, after_commit=True)
