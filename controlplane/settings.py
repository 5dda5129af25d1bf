"""Settings for the control plane, read from the environment (see docs/configuration.md).

Local defaults need no external service: a SQLite file and a filesystem Celery broker under var/.
Production (any ALLOWED_HOSTS entry that is not a loopback name) requires SECRET_KEY and turns on
HTTPS-only cookies and HSTS, so ``manage.py check --deploy`` passes.
"""

import json
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane.env import env_bool, env_int, env_list, env_str, local_secret_key
from core.api.schema import TAGS as API_TAGS

BASE_DIR = Path(__file__).resolve().parent.parent
# State (SQLite file, broker folder, keys, tokens): var/ of the checkout, or of the working directory when
# the control plane runs from an installed wheel (BASE_DIR is then site-packages).
_DEFAULT_VAR_DIR = BASE_DIR / "var" if (BASE_DIR / "manage.py").exists() else Path.cwd() / "var"
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR", str(_DEFAULT_VAR_DIR)))
VAR_DIR.mkdir(parents=True, exist_ok=True)

LOCAL_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1", "testserver"}

DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
IS_LOCAL = set(ALLOWED_HOSTS) <= LOCAL_HOSTS

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG and not IS_LOCAL:
        raise ImproperlyConfigured(
            "SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off and ALLOWED_HOSTS names "
            f"a non-local host ({', '.join(sorted(set(ALLOWED_HOSTS) - LOCAL_HOSTS))})."
        )
    SECRET_KEY = local_secret_key(VAR_DIR)
# The root every deployment's engine API key is derived from (regions/engine_keys.py); changing it
# rotates every key (the engines restart with theirs, gateways get theirs with the next route table).
ENGINE_KEY_SECRET = env_str("ENGINE_KEY_SECRET") or SECRET_KEY
# The key tenants' secrets are sealed with at rest (core/sealing.py). Changing it makes every stored
# secret unreadable: the tenants must store them again.
TENANT_SECRETS_KEY = env_str("TENANT_SECRETS_KEY") or SECRET_KEY
# Former TENANT_SECRETS_KEYs, comma-separated: values sealed under them still open until resealed
# (manage.py reseal_secrets), so the key can be rotated without a tenant storing its secrets again.
TENANT_SECRETS_KEY_FALLBACKS = env_list("TENANT_SECRETS_KEY_FALLBACKS", [])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # The apps in their dependency order, lowest first (docs/architecture.md): each imports only apps listed
    # before it. The project shell (controlplane) comes last; it may import them all.
    "core",
    "registry",
    "regions",
    "artifacts",
    "billing",
    "routing",
    "rollouts",
    "autoscaling",
    "controlplane",
    "axes",
]

MIDDLEWARE = [
    "core.observability.RequestContextMiddleware",
    "core.api.parsers.RejectOversizedBodyMiddleware",
    "core.api.parsers.RejectNulMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out sign-in into the lockout page
]

# Console sign-in throttle (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one username
# from one address, that username is locked out from that address for LOGIN_COOLOFF_MINUTES (other
# users and other addresses are unaffected). Attempts are kept in the database, so every worker and
# process shares them; the client address is REMOTE_ADDR.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"
AUTH_USER_MODEL = "controlplane.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The repository's templates/ (controlplane/templates links to it; the wheel carries a copy there).
        "DIRS": [Path(__file__).resolve().parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.views.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'controlplane.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file (not :memory:) so a Celery worker process can share the test database; WAL and a busy
    # timeout let the web process, the worker and beat write to the embedded database side by side.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A tenant admin's invitation to an existing user stays open this long.
INVITATION_TTL_DAYS = env_int("INVITATION_TTL_DAYS", 7)

# The cache holds the API's rate-limit counters. With REDIS_URL, Redis: shared by every process on
# every host. Without it, files under var/cache/: shared by every process of this host (`serve` runs
# two web workers; an in-process cache would give each its own counters, so a client would get twice
# the limit, depending on which worker answered).
REDIS_URL = env_str("REDIS_URL")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    )
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Tests and runserver serve assets from the app folders without a collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Security: strict by default; HTTPS-only behaviour switches on for non-local deployments.
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not IS_LOCAL)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not IS_LOCAL)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not IS_LOCAL)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if IS_LOCAL else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not IS_LOCAL
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not IS_LOCAL)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if env_bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Health and metrics are scraped over plain HTTP inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

# Celery: the embedded default is kombu's filesystem transport, which still runs a real worker process.
# "localhost" names no server (the transport is a folder); without a host kombu warns at every connect.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://localhost//")
BROKER_DIR = Path(env_str("CELERY_FILESYSTEM_DIR", str(VAR_DIR / "broker")))
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"  # kombu's, writing messages atomically
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        # Broadcast (pidbox) exchanges; kombu's default is ./control, relative to wherever the worker runs.
        "control_folder": str(BROKER_DIR / "control"),
        # The folder is polled (kombu's default: every second); a tenth keeps a woken deployment's
        # reconcile, and a starting engine's follow-up, within a tenth of a second of being asked for.
        "polling_interval": 0.1,
    }
# JSON only, never pickle: a message can carry data, not code (serve relies on it for its root worker).
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Run a beat per scheduler replica: only the one holding the database lease sends (controlplane/beat.py).
CELERY_BEAT_SCHEDULER = "controlplane.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "prune-idempotency-records": {"task": "controlplane.tasks.prune_idempotency_records", "schedule": 3600.0},
    "expire-invitations": {"task": "controlplane.tasks.expire_invitations", "schedule": 3600.0},
    "reap-operations": {"task": "controlplane.tasks.reap_operations", "schedule": 60.0},
    "follow-fleet": {"task": "controlplane.tasks.follow_fleet", "schedule": 60.0},
    "collect-artifact-garbage": {"task": "regions.tasks.collect_artifact_garbage", "schedule": 6 * 3600.0},
    "resume-replication": {"task": "regions.tasks.resume_replication", "schedule": 60.0},
    "evaluate-budgets": {"task": "billing.tasks.evaluate_budgets", "schedule": 300.0},
    "checkpoint-audit-chain": {
        "task": "controlplane.tasks.checkpoint_audit_chain",
        "schedule": float(env_int("AUDIT_CHECKPOINT_INTERVAL_SECONDS", 300)),
    },
    "advance-rollouts": {
        "task": "rollouts.tasks.advance_all",
        "schedule": float(env_int("ROLLOUT_INTERVAL_SECONDS", 5)),
    },
    "autoscale": {
        "task": "autoscaling.tasks.evaluate_all",
        "schedule": float(env_int("AUTOSCALE_INTERVAL_SECONDS", 15)),
    },
    "reconcile-regions": {
        "task": "regions.tasks.reconcile_all",
        "schedule": env_int("RECONCILE_INTERVAL_SECONDS", 15),
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.api.authentication.BearerTokenAuthentication",
        "core.api.authentication.PrincipalSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.conventions.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["core.api.conventions.PrincipalRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"principal": env_str("API_RATE_LIMIT", "1200/min")},
    "EXCEPTION_HANDLER": "core.api.conventions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["core.api.parsers.JSONBodyParser"],
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Control plane API",
    "DESCRIPTION": "Multi-region control plane for LLM inference. Errors use one envelope: "
    '`{"error": {"code", "message", "detail"}}`.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "cpt_<prefix>_<secret>"}
        }
    },
    "SECURITY": [{"bearer": []}],
    # Operations grouped by capability (core/api/schema.py), not all under one "v1" group.
    "TAGS": API_TAGS,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api.schema.tag_by_capability",
    ],
    "ENUM_NAME_OVERRIDES": {
        "TenantStatusEnum": "core.choices.TenantStatus",
        "OperationStatusEnum": "core.choices.OperationStatus",
        "JurisdictionEnum": "core.choices.Jurisdiction",
        "VersionStatusEnum": "registry.choices.VersionStatus",
        "RegionStatusEnum": "regions.choices.RegionStatus",
        "TargetStatusEnum": "regions.choices.TargetStatus",
        "DeploymentStateEnum": "regions.choices.DeploymentState",
        "RolloutStateEnum": "rollouts.choices.RolloutState",
        "ScalingDecisionKindEnum": "autoscaling.choices.DecisionKind",
        "ScalerModeEnum": "autoscaling.choices.ScalerMode",
        "PipelineStatusEnum": "registry.choices.PipelineStatus",
    },
}

# The platform's home store for model weights (ingested once), copied from here into regions' stores.
ARTIFACT_HOME_STORE = json.loads(
    env_str("ARTIFACT_HOME_STORE", json.dumps({"kind": "local", "root": str(VAR_DIR / "artifacts" / "home")}))
)
ARTIFACT_COPY_TUNING = {
    "part_size": env_int("ARTIFACT_PART_MB", 8) * 1024 * 1024,
    "concurrency": env_int("ARTIFACT_COPY_CONCURRENCY", 8),
}

# Where registered versions' weights may be read from (registry/sources.py): URI prefixes,
# comma-separated. By default only the local model folder the demo writes; production names its upload
# buckets and model hubs (e.g. "s3://models-upload/,https://huggingface.co/").
ARTIFACT_SOURCES = env_list("ARTIFACT_SOURCES", [f"file://{VAR_DIR.resolve() / 'models'}"])
# Stream a version's weights into the home store when it is registered.
ARTIFACT_INGEST_ON_REGISTER = env_bool("ARTIFACT_INGEST_ON_REGISTER", True)
# Start copying a version's weights into every allowed region with a store when it is staged.
ARTIFACT_REPLICATE_ON_STAGED = env_bool("ARTIFACT_REPLICATE_ON_STAGED", True)
# Replicas of retired versions are deleted this long after retirement (never while deployed).
ARTIFACT_RETENTION_DAYS = env_int("ARTIFACT_RETENTION_DAYS", 7)

# Signed checkpoints of the audit chain (docs/audit.md): key and log live outside the database. Locally a
# key is generated under var/ on first use; elsewhere checkpoints are off until a key file is configured.
AUDIT_CHECKPOINT_KEY_FILE = env_str(
    "AUDIT_CHECKPOINT_KEY_FILE", str(VAR_DIR / "audit-checkpoint.key") if IS_LOCAL else ""
)
AUDIT_CHECKPOINT_KEY_GENERATE = IS_LOCAL and not env_str("AUDIT_CHECKPOINT_KEY_FILE")
AUDIT_CHECKPOINT_DIR = env_str("AUDIT_CHECKPOINT_DIR", str(VAR_DIR / "audit-checkpoints"))

# How long an Idempotency-Key is remembered.
IDEMPOTENCY_TTL_HOURS = env_int("IDEMPOTENCY_TTL_HOURS", 24)
# last_used_at is written at most this often per token, so auth stays a read on the hot path.
TOKEN_LAST_USED_RESOLUTION_SECONDS = 60

LOG_FORMAT = env_str("LOG_FORMAT", "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "core.observability.RequestIdFilter"}},
    "formatters": {
        "json": {"()": "core.observability.JsonFormatter"},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT if LOG_FORMAT in {"json", "text"} else "json",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Cost attribution (docs/costs.md).
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "USD")
# A prompt token costs this fraction of a completion token when a shared deployment's cost is split.
BILLING_PROMPT_TOKEN_WEIGHT = env_str("BILLING_PROMPT_TOKEN_WEIGHT", "0.25")
# Weighted tokens one GPU can serve in an hour (the denominator of utilization), per GPU type.
BILLING_TOKENS_PER_GPU_HOUR = json.loads(env_str("BILLING_TOKENS_PER_GPU_HOUR", '{"default": 2000000}'))
# What a hosted API charges per million tokens, for the self-host comparison.
BILLING_HOSTED_PRICE_PER_1M = env_str("BILLING_HOSTED_PRICE_PER_1M", "0.60")
# Deployments under this utilization over the last day are flagged as idle.
BILLING_IDLE_UTILIZATION = env_str("BILLING_IDLE_UTILIZATION", "0.10")
