"""Settings for the TTS service, read from the environment.

Every value comes from an environment variable through the small typed helpers
below (the paths of files and secrets through webapp/provisioning.py); the README
has a table of all of them with their defaults. Defaults are for the local stack
that `make run` starts (everything under ``var/``). Importing them only reads:
no file or folder is created here (`python manage.py prepare_var` creates them).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from webapp.env import (
    ALLOWED_HOSTS_DEFAULT,
    DEFAULT_PROCESS_NAME,
    HOUSEKEEPING_CONCURRENCY_DEFAULT,
    STATEMENT_TIMEOUTS,
    WORKER_CONCURRENCY_DEFAULT,
    WORKER_ENGINES_DEFAULT,
    EnvError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_map,
    env_networks,
    env_origin,
    env_str,
    process_kind,
    worker_queues,
)
from webapp.provisioning import VarLayout

BASE_DIR = Path(__file__).resolve().parent.parent

# Where the files are (TTS_VAR_DIR, the media, static and log folders, the secret files):
# webapp/provisioning.py reads them from the environment. Reading the settings creates
# nothing; `python manage.py prepare_var` creates the folders and secret files.
TTS_VAR_LAYOUT = VarLayout.from_env()
VAR_DIR = TTS_VAR_LAYOUT.var_dir

# Off unless asked for (`DJANGO_DEBUG=1 make run`), and even then debug pages
# only for clients on this machine (webapp/debug_pages.py).
DEBUG = env_bool("DJANGO_DEBUG", False)
# Each secret comes from its variable, else its file; with neither (a fresh clone, a build
# step) it is empty, so commands that never sign (check, makemigrations, collectstatic,
# mypy's Django plugin) run without one. Empty, not a placeholder: Django refuses every use
# of an empty SECRET_KEY (ImproperlyConfigured), so nothing can ever sign with a key anyone
# knows; the web entry points (webapp/wsgi.py, webapp/asgi.py) refuse to start without
# either secret, naming the variable and `manage.py prepare_var`, and hashing an API key
# without its secret raises the same message (webapp/tenants/services.py).
SECRET_KEY = TTS_VAR_LAYOUT.secret_key.value()
# API keys are hashed with their own secret, so rotating SECRET_KEY (sessions)
# does not invalidate every key, and vice versa.
API_KEY_HMAC_SECRET = TTS_VAR_LAYOUT.api_key_secret.value()

# Nginx serves the same names and answers any other Host with 421 (deploy/nginx.py).
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ALLOWED_HOSTS_DEFAULT)
# Where people reach the site: the links in e-mails (reset, invitation, confirmation) start
# with it, never with the request's Host (webapp/public_urls.py).
TTS_PUBLIC_ORIGIN = env_origin("TTS_PUBLIC_ORIGIN", "https://localhost:8443")
CSRF_TRUSTED_ORIGINS = env_list(
    "DJANGO_CSRF_TRUSTED_ORIGINS", "https://localhost:8443,https://127.0.0.1:8443"
)

INSTALLED_APPS = [
    # Django's admin with our site as the default (second factor, pages of our own).
    "webapp.admin_config.OperatorAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "webapp.tenants",
    "webapp.dictionaries",
    "webapp.webhooks",
    "webapp.speech",
    "webapp.housekeeping",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "axes",
    "webapp.dashboard",
    "webapp.audit",
    # After the apps whose models its admin registers (webapp/console/admin.py).
    "webapp.console",
]

MIDDLEWARE = [
    # Outermost: one API key's requests take turns per process (webapp/gate.py).
    "webapp.gate.ClientGateMiddleware",
    # Then the request id (X-Request-Id from Nginx) names every later log line and audit event.
    "webapp.audit.middleware.RequestContextMiddleware",
    # Counts every request by view, method and status, with its latency (/metrics).
    "webapp.metrics.http.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "webapp.middleware.ProblemJsonMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its 429 answer.
    "axes.middleware.AxesMiddleware",
    # Below everything: the chain above runs in sync mode, one thread per request (why: its docstring).
    "webapp.middleware.SyncMiddlewareChain",
]
if DEBUG:
    # Outside everything but the gate, so it sees every page: debug pages for loopback clients only.
    MIDDLEWARE.insert(1, "webapp.debug_pages.LoopbackDebugPagesMiddleware")

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "webapp" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict[str, object]:
    config: dict[str, object] = dict(
        dj_database_url.parse(url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60), conn_health_checks=True)
    )
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, got {url.split(':', 1)[0]!r}")
    # postgres://user@/db?host=/path/to/socket-dir is the socket form.
    options = config.get("OPTIONS")
    if isinstance(options, dict) and "host" in options:
        config["HOST"] = options.pop("host")
    return config


DATABASES = {
    "default": _database_from_url(
        env_str("DATABASE_URL", "postgres://tts:tts@127.0.0.1:15432/tts"),
    )
}
# The ASGI web tier (webapp/asgi.py sets it) runs each request's sync code in a
# thread that ends with the request: connections come from a per-process pool.
DATABASE_POOL_SIZE = env_int("DATABASE_POOL_SIZE", 0)
if DATABASE_POOL_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool requires it
    DATABASES["default"]["OPTIONS"] = {
        **dict(DATABASES["default"].get("OPTIONS") or {}),  # type: ignore[call-overload]
        "pool": {"min_size": 2, "max_size": DATABASE_POOL_SIZE, "timeout": 10},
    }
# A connection attempt to a server that does not answer gives up after this many seconds (libpq's
# connect_timeout; a `connect_timeout` in DATABASE_URL wins), instead of the kernel's minutes.
DATABASE_CONNECT_TIMEOUT = env_int("DATABASE_CONNECT_TIMEOUT", 10)
if DATABASE_CONNECT_TIMEOUT > 0:
    DATABASES["default"]["OPTIONS"] = {
        "connect_timeout": DATABASE_CONNECT_TIMEOUT,
        **dict(DATABASES["default"].get("OPTIONS") or {}),  # type: ignore[call-overload]
    }
# `manage.py migrate` waits this many seconds at most for a lock (PostgreSQL's lock_timeout), then
# fails naming the migration, which rolls back: a migration queued behind a long transaction would
# otherwise queue every query of its table behind it. 0: no limit.
TTS_MIGRATION_LOCK_TIMEOUT = env_float("TTS_MIGRATION_LOCK_TIMEOUT", 10.0)
# `manage.py wait_for_schema` (every pod's initContainer on Kubernetes) waits this many seconds at
# most for the migrations its code needs, then fails (the pod's restart waits again).
TTS_SCHEMA_WAIT_SECONDS = env_int("TTS_SCHEMA_WAIT_SECONDS", 600)
# What one SQL statement may take (0: no limit): by default by what this process is
# (webapp/env.py, STATEMENT_TIMEOUTS); a request's statement past it answers 503.
TTS_DB_STATEMENT_TIMEOUT_SECONDS = env_float(
    "TTS_DB_STATEMENT_TIMEOUT_SECONDS",
    STATEMENT_TIMEOUTS.get(
        process_kind(env_str("TTS_PROCESS_NAME", DEFAULT_PROCESS_NAME), env_str("TTS_WORKER_ROLE", "synth")),
        0,
    ),
)
if TTS_DB_STATEMENT_TIMEOUT_SECONDS > 0:
    _db_options = dict(DATABASES["default"].get("OPTIONS") or {})  # type: ignore[call-overload]
    # After any `options` DATABASE_URL gives (its own -c settings stay).
    _db_options["options"] = " ".join(
        filter(
            None,
            [
                str(_db_options.get("options", "")),
                f"-c statement_timeout={int(TTS_DB_STATEMENT_TIMEOUT_SECONDS * 1000)}",
            ],
        )
    )
    DATABASES["default"]["OPTIONS"] = _db_options
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://:tts@127.0.0.1:16379/0")
CACHES = {
    "default": {
        # Django's, with one client per pool (webapp/redis_clients.py); Redis errors are raised,
        # never ignored: the rate limits decide what they mean (webapp/tenants/ratelimit.py).
        "BACKEND": "webapp.redis_clients.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env_str("TTS_CACHE_PREFIX", "tts"),
        # One pool per process (webapp/redis_clients.py), not a connection per request.
        "OPTIONS": {
            "socket_connect_timeout": 2,
            "socket_timeout": 5,
            "pool_class": "webapp.redis_clients.SharedConnectionPool",
        },
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if env_bool("TTS_FAST_PASSWORD_HASHER", False):
    # Tests only: a cheap hasher keeps the suite fast.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = TTS_VAR_LAYOUT.static_root
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        # Hashed names let Nginx serve static files as immutable for a year.
        "BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"
        if env_bool("TTS_MANIFEST_STATIC", not DEBUG)
        else "django.contrib.staticfiles.storage.StaticFilesStorage",
    },
}
MEDIA_ROOT = TTS_VAR_LAYOUT.media_root
# The sentence cache (issue 33): one folder per tenant of rendered sentences. Not media rows
# name: the backup leaves it out, the orphan sweep leaves it alone, eviction bounds it.
TTS_SENTENCE_CACHE_DIR = env_str("TTS_SENTENCE_CACHE_DIR", str(MEDIA_ROOT / "sentence-cache"))
# The whole cache's bytes over every tenant (0: only the plans' bounds); eviction removes the oldest past it.
TTS_SENTENCE_CACHE_MAX_BYTES = env_int("TTS_SENTENCE_CACHE_MAX_BYTES", 10 * 1024**3)
# Below this much free space on the cache's disk no entry is written: the room is the jobs' audio.
TTS_SENTENCE_CACHE_MIN_FREE_BYTES = env_int("TTS_SENTENCE_CACHE_MIN_FREE_BYTES", 1024**3)
# Nginx serves audio from this internal location after Django checked ownership.
TTS_ACCEL_REDIRECT_PREFIX = env_str("TTS_ACCEL_REDIRECT_PREFIX", "/_protected/media/")
LOG_DIR = TTS_VAR_LAYOUT.log_dir
TTS_VOICES_DIR = str(TTS_VAR_LAYOUT.voices_dir)
# Model directories an operator manages, TTS_MODELS_DIR/<engine>/ (synth.models, docs/engines.md):
# never created here; a worker runs one only as `manage.py models verify` recorded it.
TTS_MODELS_DIR = env_str("TTS_MODELS_DIR", str(TTS_VAR_LAYOUT.var_dir / "models"))

# Edge and TLS. Nginx terminates TLS and overwrites X-Forwarded-Proto/-For.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = False
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# /healthz (and /healthz/ready, /healthz/live) is probed over plain HTTP on the socket by
# supervisors and Kubernetes' probes.
SECURE_REDIRECT_EXEMPT = [r"^healthz(/ready|/live)?$"]
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# The client IP comes only from the header Nginx sets (X-Real-IP = $remote_addr,
# or the real_ip result behind a load balancer), never from what a client sent.
TTS_CLIENT_IP_HEADER = env_str("TTS_CLIENT_IP_HEADER", "HTTP_X_REAL_IP")

# Log-ins (admin and dashboard; webapp/admin_site.py, webapp/login_guard.py). django-axes
# counts failed log-ins per (user name, client address) pair; past the limit that pair is
# locked out for the cool-off time (`manage.py axes_reset` lifts it early), so nobody can
# lock another person out. Guessing one user name from many addresses meets a slow-down
# instead: a delay that doubles per failure, for addresses that failed for it.
AUTHENTICATION_BACKENDS = [
    "webapp.admin_site.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TTS_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("TTS_LOGIN_LOCKOUT_MINUTES", 15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_LOCKOUT_CALLABLE = "webapp.login_guard.lockout_response"
# A refused attempt (locked out, or slowed down) is not counted and does not restart the cool-off:
# the lockout ends a fixed time after the last password that was checked.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
TTS_LOGIN_SLOWDOWN_AFTER = env_int("TTS_LOGIN_SLOWDOWN_AFTER", 5)
TTS_LOGIN_SLOWDOWN_MAX_SECONDS = env_int("TTS_LOGIN_SLOWDOWN_MAX_SECONDS", 300)
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "webapp.client_ip.client_ip"
AXES_HTTP_RESPONSE_CODE = 429
# Staff need a TOTP code (django-otp) to enter the admin; on unless DEBUG.
TTS_ADMIN_REQUIRE_OTP = env_bool("TTS_ADMIN_REQUIRE_OTP", not DEBUG)
OTP_TOTP_ISSUER = "TTS service"

DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("TTS_MAX_BODY_BYTES", 1024 * 1024)
TTS_MAX_UPLOAD_BYTES = env_int("TTS_MAX_UPLOAD_BYTES", 20 * 1024 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["webapp.tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["webapp.speech.api.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "webapp.problems.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "TTS service API",
    "DESCRIPTION": "Multi-tenant text-to-speech. Authenticate with `Authorization: Bearer <api key>`.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page's Redoc bundle comes from our static files, never a CDN.
    "REDOC_DIST": "SIDECAR",
}

# Celery: configured from here with the CELERY_ namespace (webapp/celery.py).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None  # PostgreSQL is the truth; no result backend.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fix-up closes the database connection around every task unless this is set;
# the app closes stale ones itself before each task (webapp/celery.py, docs/decisions.md).
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1_000_000)
TTS_MAX_JOB_SECONDS = env_int("TTS_MAX_JOB_SECONDS", 1800)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longer than the longest allowed job, or Redis re-delivers a running task.
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", TTS_MAX_JOB_SECONDS * 2),
    "socket_connect_timeout": 3,
}
# A child leaves after a count of its own drawn from 85-100 % of this, later while another child of
# its node is being replaced (webapp/speech/runtime/recycling.py). billiard's own count, which ends a child
# whatever it is doing, is only a backstop far above it: waiting for a turn is bounded in time.
TTS_WORKER_MAX_TASKS_PER_CHILD = env_int("TTS_WORKER_MAX_TASKS_PER_CHILD", 200)
# Prefork, replacing a child as soon as it exits (webapp/celery_pool.py); `--pool prefork` picks it.
CELERY_WORKER_POOL = "webapp.celery_pool:TaskPool"
CELERY_WORKER_MAX_TASKS_PER_CHILD = 10 * max(0, TTS_WORKER_MAX_TASKS_PER_CHILD)
# KiB, as Celery counts it. Never 0: the worker's own recycle check (RSS, GPU
# memory, age, RTF drift) ends a child through this same after-task check in
# billiard, which only runs when a limit is set (webapp/speech/runtime/recycling.py).
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env_int("TTS_WORKER_MAX_MEMORY_KB", 2_000_000) or 2**40
# Model load happens in worker_process_init, which takes longer than Celery's 4 s default;
# a child whose model fails to load backs off inside this window (see TTS_WORKER_LOAD_BACKOFF_*).
CELERY_WORKER_PROC_ALIVE_TIMEOUT = env_float("TTS_WORKER_PROC_ALIVE_TIMEOUT", 120.0)
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Running jobs keep running through a broker outage; the job row, not the ack, is the truth.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BEAT_SCHEDULE_FILENAME = str(TTS_VAR_LAYOUT.cache_dir / "celerybeat-schedule")

# Worker behaviour (webapp/speech/runtime/worker.py, webapp/speech/runtime/recycling.py, docs/workers.md).
# synth: loads models and serves synth.<engine> queues; housekeeping: cleanup only.
TTS_WORKER_ROLE = env_str("TTS_WORKER_ROLE", "synth")
TTS_WORKER_ENGINES = env_list("TTS_WORKER_ENGINES", WORKER_ENGINES_DEFAULT)
# The queues this worker consumes; the local stack passes the same list as -Q
# and the systemd units follow the same rule (webapp/env.py, worker_queues).
TTS_WORKER_QUEUES = worker_queues(TTS_WORKER_ROLE, TTS_WORKER_ENGINES)
TTS_WORKER_DEVICE = env_str("TTS_WORKER_DEVICE", "cpu")  # cpu | cuda | cuda:N | auto
# Children per worker and inference threads per child. On 2 CPU cores two
# single-threaded children serve more audio per second than one child with two
# threads (docs/performance.md, "workers"); on a GPU run one worker per GPU with 1 child.
TTS_WORKER_CONCURRENCY = env_int("TTS_WORKER_CONCURRENCY", WORKER_CONCURRENCY_DEFAULT)
# Job slots of each engine (a child's one job, a batching child's group) that batch jobs leave free
# for interactive work (session units, /v1/audio/speech): batch holds at most slots - this, never
# fewer than one (services/lanes.py). 0 reserves nothing.
TTS_WORKER_INTERACTIVE_RESERVED = max(0, env_int("TTS_WORKER_INTERACTIVE_RESERVED", 1))
# While interactive work ran on a host this lately (seconds), a batch job there keeps to its share
# of the cores instead of taking every core when it runs alone (runtime/worker.py,
# yields_to_interactive). 0: batch jobs always take every core when alone.
TTS_WORKER_INTERACTIVE_QUIET_SECONDS = env_float("TTS_WORKER_INTERACTIVE_QUIET_SECONDS", 30.0)
# Seconds between a relay child's rounds of the deletions owed to remote models' replicas (voices
# registered there whose voice was deleted; services/upstream_voices.py).
TTS_REMOTE_VOICE_DELETE_SECONDS = env_float("TTS_REMOTE_VOICE_DELETE_SECONDS", 30.0)
# New interactive work (sessions, contexts, /v1/audio/speech) is refused with 429 while this many
# interactive jobs per child serving the engine wait to start (services/lanes.py, admit).
TTS_INTERACTIVE_QUEUE_PER_CHILD = max(1, env_int("TTS_INTERACTIVE_QUEUE_PER_CHILD", 8))
TTS_WORKER_THREADS = env_int("TTS_WORKER_THREADS", 1)
# Piper on the CPU: inference threads for a job while no other job runs on the host
# (a lone request uses every core; with company each child keeps to TTS_WORKER_THREADS).
# 0 turns it off.
TTS_WORKER_SOLO_THREADS = env_int("TTS_WORKER_SOLO_THREADS", os.cpu_count() or 1)
# Piper on onnxruntime or torch; a torch child with TTS_WORKER_BATCH_JOBS > 1 runs that many jobs
# at once and synthesises their sentences in shared batches (docs/gpu.md). CPU workers keep
# onnxruntime and one job at a time: torch and padded batches measured slower there.
_ON_GPU = TTS_WORKER_DEVICE.startswith("cuda")
TTS_WORKER_PIPER_RUNTIME = env_str("TTS_WORKER_PIPER_RUNTIME", "torch" if _ON_GPU else "onnxruntime")
TTS_WORKER_BATCH_JOBS = env_int("TTS_WORKER_BATCH_JOBS", 8 if _ON_GPU else 1)
TTS_WORKER_BATCH_WAIT_MS = env_float("TTS_WORKER_BATCH_WAIT_MS", 5.0)
# Two housekeeping children: a long orphan sweep must not hold up the 30-second lease reaper.
TTS_HOUSEKEEPING_CONCURRENCY = env_int("TTS_HOUSEKEEPING_CONCURRENCY", HOUSEKEEPING_CONCURRENCY_DEFAULT)
# Neither the local stack nor the systemd units pass --concurrency: this is the one value.
CELERY_WORKER_CONCURRENCY = (
    TTS_HOUSEKEEPING_CONCURRENCY if TTS_WORKER_ROLE == "housekeeping" else TTS_WORKER_CONCURRENCY
)
if TTS_WORKER_ROLE == "analysis":
    CELERY_WORKER_CONCURRENCY = 1  # one speaker encoder per node is plenty: prompts are 3-15 s
# On stop (Ctrl-C, `make stop`, systemctl stop) only the Celery parent is signalled;
# running jobs get this long to finish before the stack (or systemd, whose
# TimeoutStopSec is longer) kills what is left.
TTS_WORKER_STOP_GRACE = env_int("TTS_WORKER_STOP_GRACE", 60)
TTS_WORKER_MAX_RSS_MB = env_int("TTS_WORKER_MAX_RSS_MB", 1500)
TTS_WORKER_MAX_GPU_MB = env_int("TTS_WORKER_MAX_GPU_MB", 0)  # 0 = no limit
TTS_WORKER_MAX_AGE_SECONDS = env_int("TTS_WORKER_MAX_AGE_SECONDS", 6 * 3600)
# A recycle decided before this many tasks is held back and logged as an error
# (replacing such a child would loop); out-of-memory and the task count excepted.
TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE = env_int("TTS_WORKER_MIN_TASKS_BEFORE_RECYCLE", 10)
# Recycle when the rolling median RTF exceeds the child's own baseline by this factor (0 = off).
TTS_WORKER_RTF_DRIFT_FACTOR = env_float("TTS_WORKER_RTF_DRIFT_FACTOR", 2.0)
TTS_WORKER_RTF_BASELINE_TASKS = env_int("TTS_WORKER_RTF_BASELINE_TASKS", 5)
TTS_WORKER_RTF_WINDOW = env_int("TTS_WORKER_RTF_WINDOW", 10)
# Dotted path of a ``() -> float | None`` returning this process's GPU memory in MiB.
TTS_WORKER_GPU_MEMORY_READER = env_str(
    "TTS_WORKER_GPU_MEMORY_READER", "webapp.speech.runtime.recycling.read_gpu_memory_mb"
)
# A model that fails to load: wait BASE, 2*BASE, 4*BASE ... up to MAX seconds between tries.
TTS_WORKER_LOAD_BACKOFF_BASE = env_float("TTS_WORKER_LOAD_BACKOFF_BASE", 2.0)
TTS_WORKER_LOAD_BACKOFF_MAX = env_float("TTS_WORKER_LOAD_BACKOFF_MAX", 60.0)
# How long a task keeps retrying while PostgreSQL is unreachable before handing its message back.
TTS_WORKER_DB_RETRY_SECONDS = env_float("TTS_WORKER_DB_RETRY_SECONDS", 300.0)
# Out-of-memory errors (host or CUDA) re-queue a job this many times before `resource_exhausted`.
TTS_JOB_OOM_RETRIES = env_int("TTS_JOB_OOM_RETRIES", 1)
TTS_HEARTBEAT_INTERVAL = env_float("TTS_HEARTBEAT_INTERVAL", 2.0)
TTS_HEARTBEAT_TTL = env_int("TTS_HEARTBEAT_TTL", 10)
# Each synthesis child rewrites worker-<node>-<slot>.alive here at every heartbeat (state and
# time), for exec probes that ask neither Redis nor PostgreSQL (webapp/speech/runtime/probe.py).
TTS_WORKER_PROBE_DIR = TTS_VAR_LAYOUT.probe_dir
# Each read of a child's watchdog (its own thread, never the one that writes the probe file) gives
# up after this many seconds: a lock on the jobs' table or a stalled server costs a check, no more.
TTS_WATCHDOG_QUERY_TIMEOUT = env_float("TTS_WATCHDOG_QUERY_TIMEOUT", 5.0)
TTS_JOB_LEASE_SECONDS = env_int("TTS_JOB_LEASE_SECONDS", 60)
TTS_JOB_MAX_ATTEMPTS = env_int("TTS_JOB_MAX_ATTEMPTS", 3)
TTS_JOB_BASE_SECONDS = env_float("TTS_JOB_BASE_SECONDS", 30.0)
TTS_JOB_SECONDS_PER_CHAR = env_float("TTS_JOB_SECONDS_PER_CHAR", 0.02)
TTS_DISPATCH_GRACE_SECONDS = env_int("TTS_DISPATCH_GRACE_SECONDS", 10)
# Time limits follow progress (docs/workers.md): the soft limit is a budget of the child's CPU
# time; the hard ceiling (wall clock, the row's deadline) = min(soft x WALL_FACTOR, max) + this
# grace, the slack a busy host gets; a run whose progress stalls this long ends `timeout`.
TTS_JOB_HARD_GRACE_SECONDS = env_int("TTS_JOB_HARD_GRACE_SECONDS", 30)
TTS_JOB_WALL_FACTOR = env_float("TTS_JOB_WALL_FACTOR", 3.0)
TTS_JOB_STALL_SECONDS = env_int("TTS_JOB_STALL_SECONDS", 120)
# A queued job's message is re-sent once per this period (a lost delivery costs at most this);
# a job queued longer than the maximum ends `queue_timeout`.
TTS_JOB_REDELIVER_SECONDS = env_int("TTS_JOB_REDELIVER_SECONDS", 300)
TTS_JOB_MAX_QUEUE_SECONDS = env_int("TTS_JOB_MAX_QUEUE_SECONDS", 6 * 3600)
# Submissions to an engine with this many queued jobs answer 503 queue_full (0 = no limit).
TTS_MAX_QUEUED_JOBS_PER_ENGINE = env_int("TTS_MAX_QUEUED_JOBS_PER_ENGINE", 10000)
# Engine queues (synth.<engine>) served by a pool that may scale to zero (Kubernetes with KEDA,
# docs/operations.md): a submit for their voices queues while no worker is live, where any other
# queue answers 503 no_worker, and its ETA adds the pool's cold start (scale-up, start, model load).
TTS_SCALE_TO_ZERO_QUEUES = env_list("TTS_SCALE_TO_ZERO_QUEUES", "")
_NOT_SYNTH = [q for q in TTS_SCALE_TO_ZERO_QUEUES if not q.startswith("synth.") or q == "synth."]
if _NOT_SYNTH:
    raise EnvError(
        f"TTS_SCALE_TO_ZERO_QUEUES: {', '.join(_NOT_SYNTH)} is not an engine queue like synth.piper"
    )
TTS_POOL_COLD_START_SECONDS = env_float("TTS_POOL_COLD_START_SECONDS", 120.0)
# A module a worker child imports at load time to act at points of its work
# (webapp/speech/runtime/hooks.py); the tests inject faults with it. Empty = none.
TTS_WORKER_HOOKS = env_str("TTS_WORKER_HOOKS", "")

# API behaviour.
TTS_LONG_POLL_MAX_SECONDS = env_int("TTS_LONG_POLL_MAX_SECONDS", 30)
TTS_OPENAI_WAIT_SECONDS = env_int("TTS_OPENAI_WAIT_SECONDS", 120)
# POST /v1/audio/speech/batch: the largest answer (its audio in base64) it builds in memory.
# POST /v1/audio/voices (vLLM-Omni's upload): how long it waits for the voice's analysis to end.
TTS_OPENAI_VOICE_READY_SECONDS = env_float("TTS_OPENAI_VOICE_READY_SECONDS", 20.0)
# A request's reference audio (ref_audio) left without a job this long is deleted by housekeeping
# (forget_one_off_voices); normally it goes as its job ends.
TTS_ONE_OFF_VOICE_GRACE_SECONDS = env_int("TTS_ONE_OFF_VOICE_GRACE_SECONDS", 600)
TTS_OPENAI_BATCH_MAX_BYTES = env_int("TTS_OPENAI_BATCH_MAX_BYTES", 64 * 1024 * 1024)
# A client waiting on /v1/audio/speech holds a lease on its job, renewed every third of it while
# connected; a lease lapsed (the web process was killed) lets the reaper abandon the job.
TTS_WAITER_LEASE_SECONDS = env_int("TTS_WAITER_LEASE_SECONDS", 15)
# Realtime sessions (WS /v1/audio/speech/stream; docs/api.md, "Realtime sessions").
TTS_SESSIONS_PER_KEY = env_int("TTS_SESSIONS_PER_KEY", 10)
TTS_SESSIONS_PER_TENANT = env_int("TTS_SESSIONS_PER_TENANT", 50)
TTS_SESSION_CONTEXTS = env_int("TTS_SESSION_CONTEXTS", 10)
TTS_SESSION_BUFFER_CHARS = env_int("TTS_SESSION_BUFFER_CHARS", 4000)
TTS_SESSION_MESSAGES_PER_SECOND = env_int("TTS_SESSION_MESSAGES_PER_SECOND", 100)
TTS_SESSION_MAX_SECONDS = env_int("TTS_SESSION_MAX_SECONDS", 3600)
TTS_SESSION_IDLE_SECONDS = env_int("TTS_SESSION_IDLE_SECONDS", 60)
TTS_SESSION_SEND_TIMEOUT_SECONDS = env_int("TTS_SESSION_SEND_TIMEOUT_SECONDS", 20)
# Audio seconds one billable character pays for; audio longer than characters x this (speed 0.25,
# long pauses) is charged by its seconds instead (docs/api.md, "What is charged").
TTS_AUDIO_SECONDS_PER_CHAR = env_float("TTS_AUDIO_SECONDS_PER_CHAR", 0.15)
# What pronunciation dictionaries may make of a text: at most this many times its characters, or
# its characters plus the slack when that is more (a short text, an acronym). Past it a submit is
# refused, and so is a rule whose replacement is past it for its own word: a one-letter word
# mapped to a long alias would otherwise buy many times the work its characters pay for.
TTS_DICTIONARY_MAX_EXPANSION = env_float("TTS_DICTIONARY_MAX_EXPANSION", 4.0)
TTS_DICTIONARY_EXPANSION_SLACK = env_int("TTS_DICTIONARY_EXPANSION_SLACK", 50)
TTS_OPENAI_VOICE_MAP = env_map(
    "TTS_OPENAI_VOICE_MAP",
    "alloy=en_US-joe-medium,echo=en_US-joe-medium,fable=en_US-joe-medium,onyx=en_US-joe-medium,"
    "nova=en_US-joe-medium,shimmer=en_US-joe-medium,ash=en_US-joe-medium,coral=en_US-joe-medium,"
    "sage=en_US-joe-medium,ballad=en_US-joe-medium,verse=en_US-joe-medium",
)
TTS_DEFAULT_VOICE = env_str("TTS_DEFAULT_VOICE", "en_US-joe-medium")
# Voice prompts (issue 18, docs/voices.md). Uploads are probed and converted in a
# child process with these limits; the analysis runs on the `analysis` queue.
TTS_PROMPT_DECODE_TIMEOUT_SECONDS = env_float("TTS_PROMPT_DECODE_TIMEOUT_SECONDS", 20.0)
TTS_PROMPT_DECODE_MEMORY_MB = env_int("TTS_PROMPT_DECODE_MEMORY_MB", 1024)
# Consent recordings (webapp/speech/services/consents.py): how long an issued phrase may be
# recorded, and the length a recording of it may have.
TTS_CONSENT_PHRASE_MINUTES = env_int("TTS_CONSENT_PHRASE_MINUTES", 10)
TTS_CONSENT_MIN_SECONDS = env_float("TTS_CONSENT_MIN_SECONDS", 2.0)
TTS_CONSENT_MAX_SECONDS = env_float("TTS_CONSENT_MAX_SECONDS", 30.0)
# Bounds on those children (webapp/speech/services/decodes.py): uploads per tenant and
# minute (refused ones count), uploads in progress per tenant (all hosts), decode
# children at once per host (every web process of it), uploads queued for one, and the
# longest an upload waits in that queue before its 503.
TTS_VOICE_UPLOADS_PER_MINUTE = env_int("TTS_VOICE_UPLOADS_PER_MINUTE", 10)
TTS_PROMPT_DECODES_PER_TENANT = env_int("TTS_PROMPT_DECODES_PER_TENANT", 2)
TTS_PROMPT_DECODES_PER_HOST = env_int("TTS_PROMPT_DECODES_PER_HOST", 2)
TTS_PROMPT_DECODE_QUEUE = env_int("TTS_PROMPT_DECODE_QUEUE", 8)
TTS_PROMPT_DECODE_WAIT_SECONDS = env_float("TTS_PROMPT_DECODE_WAIT_SECONDS", 10.0)
# The niceness the decode child runs at (0: the web worker's own).
TTS_PROMPT_DECODE_NICE = env_int("TTS_PROMPT_DECODE_NICE", 10)
# What confines that child beyond its limits (synth.prompt.sandbox_mode): auto takes
# bubblewrap, else Landlock, else limits only; a named mode the host lacks stops the start.
TTS_PROMPT_SANDBOX = env_choice("TTS_PROMPT_SANDBOX", "auto", ("auto", "bubblewrap", "landlock", "limits"))
TTS_KEEP_VOICE_ORIGINALS = env_bool("TTS_KEEP_VOICE_ORIGINALS", False)
TTS_VOICE_RETENTION_DAYS = env_int("TTS_VOICE_RETENTION_DAYS", 180)  # unused this long: listed in the admin
TTS_ANALYSIS_TIME_LIMIT_SECONDS = env_int("TTS_ANALYSIS_TIME_LIMIT_SECONDS", 300)
TTS_ANALYSIS_MAX_ATTEMPTS = env_int("TTS_ANALYSIS_MAX_ATTEMPTS", 3)
TTS_IDEMPOTENCY_TTL_HOURS = env_int("TTS_IDEMPOTENCY_TTL_HOURS", 24)
TTS_RATELIMIT_ENABLED = env_bool("TTS_RATELIMIT_ENABLED", True)
# Failed API-key authentications one client address may make per window before every request
# it sends with credentials is answered 429 until the window ends (0: not counted);
# webapp/tenants/auth_failures.py.
TTS_AUTH_FAILURES_PER_IP = env_int("TTS_AUTH_FAILURES_PER_IP", 20)
TTS_AUTH_FAILURE_WINDOW_SECONDS = env_int("TTS_AUTH_FAILURE_WINDOW_SECONDS", 600)

# Housekeeping.
TTS_ORPHAN_GRACE_SECONDS = env_int("TTS_ORPHAN_GRACE_SECONDS", 3600)
TTS_TEMP_MAX_AGE_SECONDS = env_int("TTS_TEMP_MAX_AGE_SECONDS", 6 * 3600)
TTS_AUDIT_RETENTION_DAYS = env_int("TTS_AUDIT_RETENTION_DAYS", 90)
# Webhook messages delivered or given up (with their attempts) are kept this long for the delivery
# log; a pending one is kept whatever its age.
TTS_WEBHOOK_RETENTION_DAYS = env_int("TTS_WEBHOOK_RETENTION_DAYS", 30)
# A job's pins on dictionary versions keep those versions from deletion while it runs; kept this
# long after it finished (its record of what it applied stays on the job).
TTS_DICTIONARY_PIN_RETENTION_HOURS = env_int("TTS_DICTIONARY_PIN_RETENTION_HOURS", 24)
TTS_VOICE_PROCESSING_TIMEOUT_SECONDS = env_int("TTS_VOICE_PROCESSING_TIMEOUT_SECONDS", 1800)
TTS_HOUSEKEEPING_BATCH = env_int("TTS_HOUSEKEEPING_BATCH", 500)
# Each housekeeping task stops between batches at 80% of this, Celery interrupts
# it at 100% and kills it 60 s later; its Redis lock lives 60 s longer still.
TTS_HOUSEKEEPING_SOFT_TIME_LIMIT = env_int("TTS_HOUSEKEEPING_SOFT_TIME_LIMIT", 300)
# One beat sends the schedule: it holds a Redis lease of this TTL (renewed every third of it); a
# second beat waits, and takes over within this long after the first dies (webapp/housekeeping/locks.py).
TTS_BEAT_LEASE_SECONDS = env_int("TTS_BEAT_LEASE_SECONDS", 30)
# Folders whose old files purge_temp_files removes (never MEDIA_ROOT or var/ itself).
TTS_TEMP_DIRS = env_list("TTS_TEMP_DIRS", f"{MEDIA_ROOT / 'tmp'},{TTS_VAR_LAYOUT.tmp_dir}")
# Seconds between runs of each job (docs/housekeeping.md); TTS_HOUSEKEEPING_EVERY_<JOB> overrides one.
TTS_HOUSEKEEPING_EVERY = {
    job: env_int(f"TTS_HOUSEKEEPING_EVERY_{job.upper()}", seconds)
    for job, seconds in {
        "reap_stuck_jobs": 30,
        "redispatch_jobs": 30,
        "sweep_lost_deliveries": 60,
        "expire_audio": 600,
        "blank_old_texts": 3600,
        "reject_stale_voices": 300,
        "delete_voice_files": 600,
        "forget_one_off_voices": 300,
        "remove_orphan_files": 3600,
        "purge_temp_files": 3600,
        "prune_records": 3600,
        "snapshot_operations": 60,
        "evict_sentence_cache": 300,
    }.items()
}
# The operations page's minute snapshots are kept this long (its charts show 24 hours).
TTS_OPERATIONS_SNAPSHOT_HOURS = env_int("TTS_OPERATIONS_SNAPSHOT_HOURS", 48)
# Who may read /metrics (addresses or CIDRs); Nginx enforces the same list (webapp/metrics/).
TTS_METRICS_ALLOWED_IPS = env_list("TTS_METRICS_ALLOWED_IPS", "127.0.0.1,::1")

# Webhooks (webapp/webhooks, docs/api.md "Webhooks"): sent by the `webhooks` worker, never a synthesis one.
# Addresses or CIDRs a webhook URL may reach although they are internal (loopback, private, ...), comma
# separated, e.g. "127.0.0.1,10.20.0.0/16,fd00::/8"; plain http is allowed only to these. Empty: none.
TTS_WEBHOOK_ALLOW_PRIVATE = env_networks("TTS_WEBHOOK_ALLOW_PRIVATE", "")
# A PEM file of extra CAs trusted for https webhook receivers (besides the system's).
TTS_WEBHOOK_CA_FILE = env_str("TTS_WEBHOOK_CA_FILE", "")
TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS = env_float("TTS_WEBHOOK_CONNECT_TIMEOUT_SECONDS", 5.0)
TTS_WEBHOOK_READ_TIMEOUT_SECONDS = env_float("TTS_WEBHOOK_READ_TIMEOUT_SECONDS", 10.0)
# Retries: the first after BASE seconds, each next twice as long (at most MAX), with jitter, until
# the message is this old; an endpoint failing for DISABLE_AFTER seconds is disabled and its owners mailed.
TTS_WEBHOOK_RETRY_BASE_SECONDS = env_float("TTS_WEBHOOK_RETRY_BASE_SECONDS", 5.0)
TTS_WEBHOOK_RETRY_MAX_SECONDS = env_float("TTS_WEBHOOK_RETRY_MAX_SECONDS", 3600.0)
TTS_WEBHOOK_RETRY_WINDOW_SECONDS = env_int("TTS_WEBHOOK_RETRY_WINDOW_SECONDS", 24 * 3600)
TTS_WEBHOOK_DISABLE_AFTER_SECONDS = env_int("TTS_WEBHOOK_DISABLE_AFTER_SECONDS", 24 * 3600)
# The beat sweep runs this often and tops the queue's wake-ups up to what could be sent now (a wake-up
# lost with Redis or with its worker).
TTS_WEBHOOK_SWEEP_SECONDS = env_int("TTS_WEBHOOK_SWEEP_SECONDS", 15)
# Attempts in flight at once, over every webhooks worker: per endpoint, and per tenant (below the
# workers' children, so one tenant's slow receivers never hold all of them).
TTS_WEBHOOK_ENDPOINT_CONCURRENCY = max(1, env_int("TTS_WEBHOOK_ENDPOINT_CONCURRENCY", 2))
TTS_WEBHOOK_TENANT_CONCURRENCY = max(1, env_int("TTS_WEBHOOK_TENANT_CONCURRENCY", 2))
# Pings and redeliveries a tenant may ask for in an hour (the API and the dashboard together).
TTS_WEBHOOK_MANUAL_SENDS_PER_HOUR = env_int("TTS_WEBHOOK_MANUAL_SENDS_PER_HOUR", 60)
# How long an old secret keeps signing after a rotation.
TTS_WEBHOOK_SECRET_OVERLAP_SECONDS = env_int("TTS_WEBHOOK_SECRET_OVERLAP_SECONDS", 24 * 3600)
TTS_WEBHOOK_CONCURRENCY = env_int("TTS_WEBHOOK_CONCURRENCY", 4)
if TTS_WORKER_ROLE == "webhooks":
    CELERY_WORKER_CONCURRENCY = TTS_WEBHOOK_CONCURRENCY

# Logging: stdout and a size-rotated file per process (TTS_PROCESS_NAME) under TTS_LOG_DIR.
TTS_PROCESS_NAME = env_str("TTS_PROCESS_NAME", DEFAULT_PROCESS_NAME)
LOG_MAX_BYTES = env_int("TTS_LOG_MAX_BYTES", 10 * 1024 * 1024)
LOG_BACKUP_COUNT = env_int("TTS_LOG_BACKUP_COUNT", 5)
LOG_LEVEL = env_str("TTS_LOG_LEVEL", "INFO")
LOG_TO_FILE = env_bool("TTS_LOG_TO_FILE", True)

# text: plain lines with the request id; json: one JSON object per line (webapp/audit/logformat.py).
LOG_FORMAT = env_str("TTS_LOG_FORMAT", "text")
if LOG_FORMAT not in ("text", "json"):
    raise ValueError(f"TTS_LOG_FORMAT must be text or json, got {LOG_FORMAT!r}")
_formatter = "json" if LOG_FORMAT == "json" else "plain"
_handlers: dict[str, dict[str, object]] = {
    "console": {"class": "logging.StreamHandler", "formatter": _formatter, "filters": ["request_id"]},
}
# A file only where its folder exists: importing the settings creates no folder (`manage.py
# prepare_var` does). Without one the process logs to stderr only, rather than have the file
# handler fail on every record (it opens its file at the first one); the web entry points and
# Celery say so once as they start (webapp/provisioning.py, warn_if_no_log_folder).
if LOG_TO_FILE and LOG_DIR.is_dir():
    _handlers["file"] = {
        "class": "logging.handlers.RotatingFileHandler",
        "filename": str(LOG_DIR / f"{TTS_PROCESS_NAME}.log"),
        "maxBytes": LOG_MAX_BYTES,
        "backupCount": LOG_BACKUP_COUNT,
        "formatter": _formatter,
        "filters": ["request_id"],
        "delay": True,
    }
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(process)d %(name)s %(request_id)s %(message)s"},
        "json": {"()": "webapp.audit.logformat.JsonFormatter"},
    },
    "filters": {"request_id": {"()": "webapp.audit.logformat.RequestIdFilter"}},
    "handlers": _handlers,
    "root": {"handlers": list(_handlers), "level": LOG_LEVEL},
    "loggers": {"django.request": {"level": "ERROR"}},
}

EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# The file backend (the local stack's choice) writes one file per message here.
EMAIL_FILE_PATH = env_str("TTS_MAIL_DIR", str(VAR_DIR / "mail"))
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "tts@localhost")

# Dashboard (webapp/dashboard, docs/dashboard.md). Anyone may sign up in the
# local stack (DEBUG); a production site signs people up by invitation only.
TTS_SIGNUP = env_str("TTS_SIGNUP", "open" if DEBUG else "invite")
TTS_SIGNUP_PER_IP_HOURLY = env_int("TTS_SIGNUP_PER_IP_HOURLY", 5)
# Who to ask for an account when sign-up is by invitation: one line the front page and the
# closed sign-up page show (an address, a team, a form's URL), set by the operator.
TTS_SIGNUP_CONTACT = env_str("TTS_SIGNUP_CONTACT", "")
# Invitations (a pending row until the link is followed) per inviter and per tenant per hour,
# and how long a link works.
TTS_INVITATIONS_PER_INVITER_HOURLY = env_int("TTS_INVITATIONS_PER_INVITER_HOURLY", 20)
TTS_INVITATIONS_PER_TENANT_HOURLY = env_int("TTS_INVITATIONS_PER_TENANT_HOURLY", 50)
TTS_INVITATION_DAYS = env_int("TTS_INVITATION_DAYS", 7)
# Account mails (password reset, address confirmation, invitations) per recipient address
# and per client address per hour.
TTS_ACCOUNT_MAILS_PER_ADDRESS_HOURLY = env_int("TTS_ACCOUNT_MAILS_PER_ADDRESS_HOURLY", 5)
TTS_ACCOUNT_MAILS_PER_IP_HOURLY = env_int("TTS_ACCOUNT_MAILS_PER_IP_HOURLY", 20)
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:synthesize"
LOGOUT_REDIRECT_URL = "dashboard:home"

# Celery beat: one entry per housekeeping job, on the housekeeping queue. A
# message not picked up before the next tick expires, so a stopped
# housekeeping worker does not come back to a pile of identical runs.
CELERY_BEAT_SCHEDULE = {
    f"housekeeping.{job}": {
        "task": f"housekeeping.{job}",
        "schedule": float(every),
        "options": {"queue": "housekeeping", "expires": float(every)},
    }
    for job, every in TTS_HOUSEKEEPING_EVERY.items()
}
# The webhook outbox's sweep, on the webhooks queue (its worker, not housekeeping, sends them).
CELERY_BEAT_SCHEDULE["webhooks.sweep"] = {
    "task": "webhooks.sweep",
    "schedule": float(TTS_WEBHOOK_SWEEP_SECONDS),
    "options": {"queue": "webhooks", "expires": float(TTS_WEBHOOK_SWEEP_SECONDS)},
}
