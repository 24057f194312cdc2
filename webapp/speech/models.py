"""Voices, synthesis jobs and the usage ledger.

The job row is the truth and the outbox: Celery messages only say "look at job
X"; every state change goes through ``webapp.speech.services``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.tenants.models import ApiKey, Organization


class ConsentPhrase(models.Model):
    """A phrase issued for a speaker to read: a random code, valid for a few minutes, read once.

    The consent recording must say its code (``VoiceConsent``); an expired or used phrase
    records nothing.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="consent_phrases")
    language = models.CharField(max_length=35)
    text = models.TextField()
    code = models.CharField(max_length=6)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "expires_at"])]

    def __str__(self) -> str:
        return self.phrase_id

    @property
    def phrase_id(self) -> str:
        return f"phr_{self.id.hex}"


class VoiceConsent(models.Model):
    """A speaker's recorded consent to a synthetic voice: what cloning a voice requires.

    Kept for audit after revocation and after its voices are deleted (the recording
    itself goes with the voice; its checksum stays).
    """

    class Status(models.TextChoices):
        ACTIVE = "active"
        REVOKED = "revoked"

    MAX_NAME_CHARS = 200

    class Check(models.TextChoices):
        RECOGNISED = "recognised"  # speech recognition heard the phrase's code
        ATTESTED = "attested"  # a language the recogniser cannot check: an owner attested it

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="voice_consents")
    name = models.CharField(max_length=200)
    language = models.CharField(max_length=35)
    phrase_text = models.TextField()
    code = models.CharField(max_length=6)
    checked_by = models.CharField(max_length=12, choices=Check.choices)
    heard_code = models.CharField(max_length=32, blank=True)
    recording_path = models.CharField(max_length=500, blank=True)
    recording_sha256 = models.CharField(max_length=64)
    recording_bytes = models.PositiveBigIntegerField(default=0)
    recording_seconds = models.FloatField(default=0.0)
    embedding = models.JSONField(null=True, blank=True)  # the speaker's, set by the analysis worker
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_label = models.CharField(max_length=300)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by_label = models.CharField(max_length=300, blank=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "created_at"])]

    def __str__(self) -> str:
        return self.consent_id

    @property
    def consent_id(self) -> str:
        return f"cons_{self.id.hex}"


class Voice(models.Model):
    """A voice a job can use: built-in (organization is null) or a tenant's own."""

    class Status(models.TextChoices):
        READY = "ready"
        PROCESSING = "processing"
        REJECTED = "rejected"
        DELETED = "deleted"

    # What an upload may name it and say its prompt says (the API's form and the dashboard's).
    MAX_NAME_CHARS = 200
    MAX_TRANSCRIPT_CHARS = 2000
    MAX_DESCRIPTION_CHARS = 500

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # The public id clients send ("en_US-joe-medium", "espeak-cmn", ...).
    voice_id = models.CharField(max_length=200, unique=True)
    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.CASCADE, related_name="voices"
    )
    name = models.CharField(max_length=200)
    engine = models.CharField(max_length=50)
    language = models.CharField(max_length=50)
    sample_rate = models.PositiveIntegerField()
    capabilities = models.JSONField(default=dict)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.READY)
    status_reason = models.CharField(max_length=500, blank=True)
    prompt_path = models.CharField(max_length=500, blank=True)
    prompt_bytes = models.PositiveBigIntegerField(default=0)
    # Uploaded voices (issue 18; docs/voices.md). The prompt is biometric data:
    # deleting the voice clears every field below and removes the files at once.
    original_path = models.CharField(max_length=500, blank=True)  # kept only with TTS_KEEP_VOICE_ORIGINALS
    transcript = models.TextField(blank=True)
    description = models.CharField(max_length=500, blank=True)  # the uploader's words about the voice
    # A request's own reference audio (ref_audio on /v1/audio/speech): listed nowhere, counted in no
    # plan's voices, deleted once its job ends (webapp/speech/voices.py).
    one_off = models.BooleanField(default=False)
    consent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    consent_by_label = models.CharField(max_length=300, blank=True)  # user or API key, kept if that goes
    consent_at = models.DateTimeField(null=True, blank=True)
    # The checked consent that lets a zero_shot voice be cloned (docs/voices.md, "Consent").
    consent = models.ForeignKey(
        VoiceConsent, null=True, blank=True, on_delete=models.PROTECT, related_name="voices"
    )
    cloning_mode = models.CharField(max_length=12, blank=True)  # zero_shot | approximate; "" for built-ins
    rejected_code = models.CharField(max_length=50, blank=True)
    prompt_stats = models.JSONField(default=dict, blank=True)  # levels measured on the upload
    embedding = models.JSONField(null=True, blank=True)  # speaker embedding (256 floats)
    pitch_median_hz = models.FloatField(null=True, blank=True)
    pitch_low_hz = models.FloatField(null=True, blank=True)
    pitch_high_hz = models.FloatField(null=True, blank=True)
    closest_voice = models.CharField(
        max_length=200, blank=True
    )  # approximate: the built-in voice that speaks
    closest_similarity = models.FloatField(null=True, blank=True)
    pitch_shift = models.FloatField(default=0.0)  # approximate: semitones applied to closest_voice
    last_used_at = models.DateTimeField(null=True, blank=True)
    analysis_attempts = models.PositiveIntegerField(default=0)
    analysis_lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["organization", "status"])]

    def __str__(self) -> str:
        return self.voice_id


class UpstreamVoice(models.Model):
    """A cloned voice registered on one replica of a remote model (synth/engines/remote.py).

    Recorded before its upload starts. While ``voice`` is set, the replica may be sent the voice's
    name once ``registered_at`` is. When the voice is deleted (any path: its owner, its consent's
    revocation, a one-off voice's job ending, a tenant's deletion), ``voice`` becomes NULL and the
    row is a deletion owed to the replica: a relay worker retries it until the replica confirms
    (services/upstream_voices.py), then deletes the row. It is biometric data on another server.
    """

    id = models.BigAutoField(primary_key=True)
    voice = models.ForeignKey(
        Voice, null=True, blank=True, on_delete=models.SET_NULL, related_name="upstream_copies"
    )
    engine = models.CharField(max_length=50)  # the remote model's name
    upstream = models.CharField(max_length=500)  # the replica's base URL
    name = models.CharField(max_length=200)  # the voice's name there (remote.upstream_voice_name)
    created_at = models.DateTimeField(auto_now_add=True)
    upload_started_at = models.DateTimeField()
    registered_at = models.DateTimeField(null=True, blank=True)
    # The deletion owed (voice NULL): its tries, when the next may run, what the replica last said.
    delete_attempts = models.PositiveIntegerField(default=0)
    next_delete_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["engine", "upstream", "name"], name="speech_upstream_voice_once"),
        ]
        indexes = [
            models.Index(
                fields=["engine", "next_delete_at"],
                condition=models.Q(voice__isnull=True),
                name="speech_upstream_voice_owed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} on {self.upstream}"


class JobStatus(models.TextChoices):
    """A job's state; only webapp/speech/lifecycle/ changes it."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
FINISHED_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.EXPIRED)


def sql_status_in(statuses: tuple[JobStatus, ...], column: str = "status") -> str:
    """``status IN ('queued', 'running')`` for hand-written SQL, from the enum (fixed literals)."""
    return f"{column} IN (" + ", ".join(f"'{s.value}'" for s in statuses) + ")"


# Jobs that count against a tenant's limits: queued or running, or holding audio. Job
# rows are kept for good; the limits read only these (through speech_job_org_stored_idx,
# whose condition this is: a query must state it as is for PostgreSQL to use the index).
# LIVE_JOBS_SQL says the same in SQL (tests/integration/test_job_rules.py checks both).
LIVE_JOBS = models.Q(status__in=ACTIVE_STATUSES) | models.Q(audio_bytes__gt=0)
LIVE_JOBS_SQL = f"({sql_status_in(ACTIVE_STATUSES)} OR audio_bytes > 0)"


class SpeechSession(models.Model):
    """A realtime session: one WebSocket on which a client sends text as it is written and gets
    audio per speakable unit (webapp/speech/api/session_socket.py). History, usage and webhooks show the
    session as one entry; each unit is a job of its own underneath (``SynthesisJob.session``),
    claimed, fenced and settled like any other, but listed and announced only through this row."""

    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="speech_sessions")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    protocol = models.CharField(max_length=20, default="native")  # the dialect the client spoke
    voice_name = models.CharField(max_length=200, blank=True)  # the last configuration's
    format = models.CharField(max_length=10, blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    close_code = models.PositiveIntegerField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True)
    contexts = models.PositiveIntegerField(default=0)
    units = models.PositiveIntegerField(default=0)
    received_chars = models.PositiveIntegerField(default=0)  # text the client sent
    charged_chars = models.PositiveIntegerField(default=0)  # what its units were charged, summed at close
    audio_seconds = models.FloatField(default=0.0)  # audio that left for the client
    created_at = models.DateTimeField(default=timezone.now)
    # Renewed by the web process that holds the socket: a session whose process died is closed
    # by the reaper once this lapses (lifecycle beat).
    alive_until = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["organization", "-created_at"]),
            # The limits count a tenant's and a key's open sessions; the reaper looks for lapsed ones.
            models.Index(
                fields=["organization", "api_key"],
                condition=models.Q(status="open"),
                name="speech_session_open_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"session {self.id} ({self.status})"


class JobLane(models.TextChoices):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class SynthesisJob(models.Model):
    Status = JobStatus
    Lane = JobLane
    ACTIVE = ACTIVE_STATUSES
    FINISHED = FINISHED_STATUSES

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="jobs")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    voice = models.ForeignKey(Voice, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    # A unit of a realtime session: listed and announced through its session, not on its own.
    session = models.ForeignKey(
        SpeechSession,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="unit_jobs",
        db_index=False,
    )
    voice_name = models.CharField(max_length=200)
    engine = models.CharField(max_length=50)
    text = models.TextField()
    text_chars = models.PositiveIntegerField()
    # Characters the engine is given: the text after its pronunciation dictionaries (NULL: the
    # text's own). Its time limits are sized on it (dispatch.job_time_limits), not on what is billed.
    synth_chars = models.PositiveIntegerField(null=True, blank=True)
    format = models.CharField(max_length=10)
    sample_rate = models.PositiveIntegerField(null=True, blank=True)
    params = models.JSONField(default=dict)  # speed, pitch, volume, language, instructions
    cloning_mode = models.CharField(max_length=12, blank=True)  # uploaded voices: zero_shot | approximate
    source = models.CharField(max_length=20, default="api")  # api | openai | dashboard
    # Interactive work (a client waiting on its audio: session units, /v1/audio/speech) is claimed
    # before batch work of the same engine (lifecycle.claim_next); docs/workers.md, "Lanes".
    lane = models.CharField(max_length=12, choices=JobLane.choices, default=JobLane.BATCH, db_default="batch")
    # The X-Request-Id of the submit (Nginx's $request_id): log lines of every attempt carry it.
    request_id = models.CharField(max_length=64, blank=True)
    # The submit's own webhook URL: this job's job.* events go there too (webapp/webhooks).
    webhook_url = models.URLField(max_length=2000, blank=True, default="")
    # An operator's Retry of a failed job is a new job (its own reservation) that names the old one.
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    stage = models.CharField(max_length=100, default="queued")
    cancel_requested = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    oom_retries = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # The fencing token: +1 at every claim. Every write of a running attempt
    # carries it and matches only while it is current (docs/workers.md).
    claim_token = models.PositiveBigIntegerField(default=0)
    deadline = models.DateTimeField(null=True, blank=True)  # claim + time_limit, database clock
    # The job's hard limit (dispatch.job_time_limits, from its length), fixed at submit.
    time_limit = models.DurationField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)  # last advance, for the stall timeout
    # The lease of a client waiting on the job (/v1/audio/speech): renewed while it is
    # connected; lapsed, the job is abandoned by the reaper (its web process died).
    waiter_until = models.DateTimeField(null=True, blank=True)
    # What streams handed to clients of this job (its most, over every stream and attempt):
    # a cancel, delete or disconnect charges it (docs/api.md, "What is charged").
    delivered_chars = models.PositiveIntegerField(default=0, db_default=0)
    delivered_seconds = models.FloatField(default=0.0, db_default=0.0)
    # Characters of sentences served from the tenant's sentence cache (billed at the plan's
    # cached_character_price), and whether the submit allowed the cache (``cache``).
    cached_characters = models.PositiveIntegerField(default=0, db_default=0)
    use_cache = models.BooleanField(default=True, db_default=True)
    queued_at = models.DateTimeField(null=True, blank=True)  # last entry into the queue
    # The pronunciation dictionary versions pinned at submit (webapp.dictionaries), in the request's
    # order: what they were ({"id", "version", "name", "version_id"}, readable after a dictionary is
    # deleted), and the rows, so a dictionary a queued or running job needs cannot be deleted.
    dictionaries = models.JSONField(default=list, blank=True, db_default=[])
    pinned_dictionary_versions = models.ManyToManyField(
        "dictionaries.DictionaryVersion", related_name="pinning_jobs", blank=True
    )

    created_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    audio_path = models.CharField(max_length=500, blank=True)  # relative to MEDIA_ROOT
    audio_bytes = models.PositiveBigIntegerField(default=0)
    # The job's word timestamps as stored (JobTimestamps, its JSON): counted in the tenant's storage
    # beside the audio, as long as the row is kept (published with the audio, gone with it or the text).
    timestamps_bytes = models.PositiveIntegerField(default=0, db_default=0)
    duration_seconds = models.FloatField(null=True, blank=True)
    metrics = models.JSONField(default=dict)
    applied_instructions = models.JSONField(default=dict)  # {"applied": [...], "not_applied": [...]}
    error_code = models.CharField(max_length=50, blank=True)
    error_message = models.CharField(max_length=1000, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["organization", "-created_at"]),
            models.Index(fields=["status", "created_at"]),
            models.Index(fields=["status", "lease_until"]),
            models.Index(fields=["status", "expires_at"]),
            # The ETA's rolling mean reads an engine's latest successes on every job GET.
            models.Index(
                fields=["engine", "-finished_at"],
                condition=models.Q(status="succeeded"),
                name="speech_job_engine_done_idx",
            ),
            # Fair claims pick among an engine's queued jobs, oldest first.
            models.Index(
                fields=["engine", "created_at"],
                condition=models.Q(status="queued"),
                name="speech_job_engine_queued_idx",
            ),
            # Every submit counts the tenant's active jobs and sums its stored audio: this
            # index holds only those rows, so that costs what is live, not the whole history.
            models.Index(
                fields=["organization"],
                include=["status", "audio_bytes", "timestamps_bytes"],
                condition=LIVE_JOBS,
                name="speech_job_org_stored_idx",
            ),
            # KEDA's count of an engine queue's queued + running jobs (services/keda.py), and the
            # ETA's jobs ahead: only the active rows, however long the history.
            models.Index(
                fields=["engine"],
                condition=models.Q(status__in=["queued", "running"]),
                name="speech_job_engine_active_idx",
            ),
            # The reaper's look for held jobs whose waiting client's lease lapsed: active ones, and
            # succeeded ones whose answer is being handed (lifecycle HELD); a handful, whatever the history.
            models.Index(
                fields=["waiter_until"],
                condition=models.Q(status__in=["queued", "running", "succeeded"], waiter_until__isnull=False),
                name="speech_job_held_idx",
            ),
            # A session's units (its renewals, totals and close); most jobs have none, and are not in it.
            models.Index(
                fields=["session"], condition=models.Q(session__isnull=False), name="speech_job_session_idx"
            ),
            # Text retention's look for finished jobs whose text is still kept (blank_old_texts), per
            # tenant of a plan: the rows blanked already, most of the history, are not in it.
            models.Index(
                fields=["organization", "finished_at"],
                condition=models.Q(status__in=["succeeded", "failed", "canceled", "expired"])
                & ~models.Q(text=""),
                name="speech_job_text_kept_idx",
            ),
        ]
        constraints = [
            # A worker from before the fencing token (attempts + 1, no token) cannot claim.
            models.CheckConstraint(
                condition=~models.Q(status="running") | models.Q(claim_token__gte=models.F("attempts")),
                name="speech_job_running_has_token",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class ClaimProtocol(models.Model):
    """The claim protocol the schema speaks; a worker whose code speaks an older one refuses to claim."""

    version = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"claim protocol {self.version}"


class UsagePeriod(models.Model):
    """Characters used and reserved by a tenant in one calendar month (UTC).

    The row is locked (SELECT ... FOR UPDATE) while a reservation is made, so
    parallel submits can never overshoot the plan.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="usage_periods")
    period = models.DateField()  # first day of the month
    characters_used = models.PositiveBigIntegerField(default=0)
    characters_reserved = models.PositiveBigIntegerField(default=0)
    # The highest quota level (percent of the plan's month, the ledger's QUOTA_LEVELS) the owners were
    # told of this month: each level is announced once (issue 35).
    quota_level_announced = models.PositiveSmallIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "period"], name="one_usage_row")]

    def __str__(self) -> str:
        return f"{self.organization_id} {self.period:%Y-%m}"


class UsageEvent(models.Model):
    """Ledger: one reserve, then one settlement (a charge or a release) per job, never more.

    A charge lists its parts (the ledger's parts: fresh, delivered before a cancel or
    disconnect); ``characters`` is their sum.
    """

    class Kind(models.TextChoices):
        RESERVE = "reserve"
        CHARGE = "charge"
        RELEASE = "release"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="usage_events")
    job = models.ForeignKey(SynthesisJob, null=True, on_delete=models.SET_NULL, related_name="usage_events")
    job_key = models.UUIDField()  # survives job deletion, keeps uniqueness
    kind = models.CharField(max_length=10, choices=Kind.choices)
    characters = models.PositiveIntegerField()
    parts = models.JSONField(default=list, blank=True, db_default=[])
    period = models.DateField()
    created_at = models.DateTimeField(default=timezone.now)
    # Who and what the characters were for, copied from the job at the reservation (and from the
    # reservation to its settlement): the job's own links go when it is deleted, the bill's must not.
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    voice_name = models.CharField(max_length=200, blank=True, default="", db_default="")
    source = models.CharField(max_length=20, blank=True, default="", db_default="")  # api, openai, dashboard

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job_key", "kind"], name="one_event_per_job_kind")]
        indexes = [
            models.Index(fields=["organization", "created_at"]),
            # A key's month (a capped key's submits read it: ledger.key_characters).
            models.Index(fields=["api_key", "period"], name="speech_usage_key_period_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.characters} for job {self.job_key}"


class KeyUsage(models.Model):
    """The characters one key took in one month: reserved until settled, then charged.

    Kept by the ledger with each reservation and settlement (under the tenant row's lock), so a
    capped key's submit reads one row, not the key's month of events.
    """

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    period = models.DateField()  # first day of the month
    characters = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["api_key", "period"], name="one_key_usage_row")]

    def __str__(self) -> str:
        return f"{self.api_key_id} {self.period:%Y-%m}: {self.characters}"


class UsageDay(models.Model):
    """A tenant's ledger summed per UTC day of the reservation (the submit), key, member, voice, source.

    Kept by the ledger with each reservation and settlement, so the usage reports read one row per
    day and group, not each job's events. The key and member are ids, not links: a deleted key's
    or a departed member's characters stay theirs on the report.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    api_key_id = models.UUIDField(null=True, blank=True)
    user_id = models.BigIntegerField(null=True, blank=True)
    voice_name = models.CharField(max_length=200, blank=True, default="")
    source = models.CharField(max_length=20, blank=True, default="")
    jobs = models.PositiveBigIntegerField(default=0)  # reservations
    reserved = models.PositiveBigIntegerField(default=0)  # characters reserved
    charged_jobs = models.PositiveBigIntegerField(default=0)  # charges (a release is none)
    characters = models.PositiveBigIntegerField(default=0)  # characters charged: what the bill counts
    cached_characters = models.PositiveBigIntegerField(default=0)  # of the charged text, from the cache
    fresh_characters = models.PositiveBigIntegerField(default=0)  # of the charged text, rendered whole
    released = models.PositiveBigIntegerField(default=0)  # characters reserved and not charged

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "day", "api_key_id", "user_id", "voice_name", "source"],
                name="one_usage_day_row",
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.organization_id} {self.day}: {self.characters}"


class RetiredUsage(models.Model):
    """The ledger's totals of deleted tenants: per month and plan, naming no tenant."""

    period = models.DateField()
    plan = models.CharField(max_length=50)  # the plan's slug
    tenants = models.PositiveIntegerField(default=0)
    characters_used = models.PositiveBigIntegerField(default=0)
    jobs = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["period", "plan"], name="one_retired_usage_row")]

    def __str__(self) -> str:
        return f"{self.plan} {self.period:%Y-%m}: {self.characters_used} characters"


class IdempotencyKey(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    job = models.ForeignKey(SynthesisJob, null=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "key"], name="one_idempotency_key")]
        indexes = [models.Index(fields=["created_at"])]

    def __str__(self) -> str:
        return self.key


class JobTimestamps(models.Model):
    """A job's word and sentence timestamps (synth.timestamps), published with its audio.

    A table of its own, not a column of the job: the list can run to a thousand words, and the
    job rows are read everywhere (claims, lists, waits). Written in the transaction that publishes
    the audio and deleted in the one that expires it (lifecycle), with the job by cascade.
    """

    job = models.OneToOneField(SynthesisJob, on_delete=models.CASCADE, primary_key=True, related_name="+")
    # [{"text", "start", "end", "char_start", "char_end"[, "spoken"]}], seconds and submitted-text offsets
    words = models.JSONField(default=list)
    sentences = models.JSONField(default=list)  # the same per sentence, with "index"

    def __str__(self) -> str:
        return f"timestamps of {self.job_id}"
