"""Django settings. Every value comes from `loomcycle_project.env`; the runtime's
own knobs are `LOOMCYCLE`, which apps and workers read (never the env module)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from loomcycle_project import env as E
from workers.beat import beat_schedule

BASE_DIR = E.BASE_DIR
DEBUG = E.DEBUG
# No secret has a default: DJANGO_SECRET_KEY, else the one manage.py generated
# into the data directory (loomcycle_project.instance_secrets), else a random key
# per process (admin sessions then do not survive; the API uses bearer tokens).
_SECRET_KEY, SECRET_KEY_SOURCE = E.secret_key()
SECRET_KEY = _SECRET_KEY or secrets.token_urlsafe(50)
_PEPPER, OPERATOR_TOKEN_PEPPER_SOURCE = E.operator_token_pepper()
_MOCK_ENABLED, MOCK_ENABLED_SOURCE = E.mock_enabled()
# Any host by default: a credential (LOOMCYCLE_AUTH_TOKEN or an admin operator
# token, which can be minted at runtime) is the boundary. While there is none
# (open mode), apps.substrate.openmode answers loopback host names only, decided
# per request: without that, a DNS-rebinding web page could drive the
# unauthenticated API from a browser. Names listed in LOOMCYCLE_ALLOWED_HOSTS
# are answered in open mode too.
ALLOWED_HOSTS = E.ALLOWED_HOSTS or ["*"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # /v1/docs renders with its bundled swagger-ui files (served by WhiteNoise), not a CDN
    "channels",
    "apps.core",  # its migration creates the pgvector extension
    "apps.substrate",
    "apps.gateway",
    "apps.runs",
    "apps.memory",
    "apps.evaluations",
    "apps.channels",
    "apps.triggers",
    "apps.budgets",  # limits and usage (issue 37): wakes waiting_budget runs through apps.runs.wake
    "apps.tools",
    "apps.mcp",
    "apps.snapshots",  # spans the apps above: each exports and restores its own tables
    "apps.lifecycle",  # spans the apps above: retention, run-tree deletes' listeners, a person's erasure
    "apps.grpcapi",  # the gRPC transport over the apps above (`manage.py grpc`)
    "apps.a2a",  # the A2A transport over the apps above (apps.a2a.http, mounted by asgi.py)
    "apps.console",  # the web console at /ui (server-rendered pages over the apps above)
    # Last: what spans the apps (the `up`, `boot`, `doctor`, `init`, `token`
    # and `hash` commands, boot's yaml load, /healthz), so apps/core stays the floor.
    "loomcycle_project",
    # The user's own apps (LOOMCYCLE_EXTRA_APPS), last: they extend the runtime and never
    # shadow its management commands or templates (an earlier app wins those).
    *E.checked_apps(E.EXTRA_APPS),
]

# The browser middleware serves the admin; API paths (/v1/, /healthz) skip it
# (apps.core.middleware: each is a hop to Django's sync thread per request).
MIDDLEWARE = [
    "apps.substrate.openmode.OpenModeHostMiddleware",
    "apps.core.middleware.SecurityMiddleware",
    # Before the session and CSRF middleware, so that on the way out it sees the cookies they set.
    "apps.core.middleware.SecureCookiesMiddleware",
    "apps.core.middleware.WhiteNoiseMiddleware",  # the admin's CSS/JS under Daphne
    "apps.core.middleware.SessionMiddleware",
    "apps.core.middleware.CommonMiddleware",
    "apps.core.middleware.CsrfViewMiddleware",
    "apps.core.middleware.AuthenticationMiddleware",
    "apps.core.middleware.MessageMiddleware",
    "apps.core.middleware.XFrameOptionsMiddleware",
    "loomcycle_project.replicas.WebPresenceMiddleware",
]
X_FRAME_OPTIONS = "DENY"  # the admin is never framed (clickjacking)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = E.COOKIE_SECURE
if E.SECURE_PROXY_SSL_HEADER:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + E.SECURE_PROXY_SSL_HEADER.upper().replace("-", "_"), "https")

ROOT_URLCONF = "loomcycle_project.urls"
ASGI_APPLICATION = "loomcycle_project.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _network_timeouts(seconds: int) -> dict[str, int]:
    """libpq's parameters that bound a silent network (a partition drops packets, no reset comes):
    the connect, data sent and never acknowledged (tcp_user_timeout), and an idle or waiting
    connection whose peer vanished (keepalive probes). libpq ignores the TCP ones on a unix socket."""
    if seconds <= 0:
        return {}
    probe = max(1, seconds // 3)
    return {
        "connect_timeout": seconds,
        "tcp_user_timeout": seconds * 1000,
        "keepalives": 1,
        "keepalives_idle": probe,
        "keepalives_interval": probe,
        "keepalives_count": 3,
    }


def _database() -> dict[str, object]:
    url = E.database_url()
    if not url:
        # manage.py / up / the pytest plugin fill DATABASE_URL with the embedded
        # server before Django starts; reaching here means another entry point.
        return {"ENGINE": "django.db.backends.postgresql", "NAME": "loomcycle", "OPTIONS": {}}
    cfg: dict[str, object] = dict(E.env.db_url_config(url))
    # Django's PostgreSQL backend whose pool checks idle connections without a
    # round trip, so a Postgres restart leaves no dead connection to lend.
    cfg["ENGINE"] = "loomcycle_project.db"
    options = dict(cfg.get("OPTIONS") or {})  # type: ignore[call-overload]
    # psycopg pool: a worker thread hands its connection back before every
    # provider call, so 1,000 in-flight calls do not hold 1,000 connections.
    options["pool"] = {"min_size": 1, "max_size": E.PG_POOL_MAX, "timeout": 30}
    # Server-side binding. Django keeps psycopg's automatic preparation off
    # (prepare_threshold None); the engine prepares its three hot statements
    # explicitly (apps.runs.store), and generic plans make Postgres plan each
    # once per connection. Only prepared statements follow plan_cache_mode, so
    # every other query keeps its custom plan (and its partial indexes).
    options.update(_network_timeouts(E.PG_NETWORK_TIMEOUT_SECONDS))
    options["server_side_binding"] = True
    options["options"] = (str(options.get("options") or "") + " -c plan_cache_mode=force_generic_plan").strip()
    cfg["OPTIONS"] = options
    cfg["CONN_MAX_AGE"] = 0
    cfg["TEST"] = {"NAME": "test_loomcycle"}
    return cfg


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_TZ = True
USE_I18N = False
STATIC_URL = "static/"
# WhiteNoise serves static files straight from the installed apps: no
# collectstatic step and no STATIC_ROOT.
WHITENOISE_USE_FINDERS = True

DATA_UPLOAD_MAX_MEMORY_SIZE = E.MAX_REQUEST_BYTES

REDIS_URL = E.redis_url() or ""


def celery_broker(redis_url: str, fast: bool) -> tuple[str, str | None]:
    """Celery's broker URL and transport. With LOOMCYCLE_FAST_TRANSPORT on, a
    redis:// or redis+socket:// REDIS_URL is served by workers/transport.py,
    named by its dotted path (kombu reads a `+` URL's prefix as the transport
    ahead of broker_transport, so the socket form goes as `socket://` to the
    transport that takes it unparsed). Otherwise kombu picks its own transport
    from the URL's scheme."""
    if not fast:
        return redis_url, None
    if redis_url.startswith("redis://"):
        return redis_url, "workers.transport:Transport"
    if redis_url.startswith("redis+socket://"):
        return redis_url.removeprefix("redis+"), "workers.transport:SocketTransport"
    return redis_url, None


# Celery (DESIGN.md "Celery settings for this workload").
CELERY_BROKER_URL, CELERY_BROKER_TRANSPORT = celery_broker(REDIS_URL, E.FAST_TRANSPORT)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 7200}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TIME_LIMIT = 1800  # well under the broker visibility timeout
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Off by default: task events cost several broker writes per iteration. Flower
# switches them on at runtime while it runs (its --enable_events default).
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_WORKER_ENABLE_SOFT_SHUTDOWN_ON_IDLE = True
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = 10.0
CELERY_BEAT_SCHEDULE_FILENAME = str(E.DATA_DIR / "celerybeat-schedule")
# Celery's PersistentScheduler plus a heartbeat file for container healthchecks.
CELERY_BEAT_SCHEDULER = "workers.heartbeat:HeartbeatScheduler"

LOOMCYCLE = E.RuntimeSettings(
    listen_addr=E.LISTEN_ADDR,
    auth_token=E.AUTH_TOKEN,
    config_files=tuple(E.CONFIG_FILES),
    config_dir=E.CONFIG_DIR,
    presets=tuple(E.PRESETS),
    config_strict=E.CONFIG_STRICT,
    agents_root=E.AGENTS_ROOT,
    skills_root=E.SKILLS_ROOT,
    max_request_bytes=E.MAX_REQUEST_BYTES,
    max_image_bytes=E.MAX_IMAGE_BYTES,
    image_fetch_timeout_ms=E.IMAGE_FETCH_TIMEOUT_MS,
    sse_keepalive_ms=E.SSE_KEEPALIVE_MS,
    tool_parallelism=E.TOOL_PARALLELISM,
    tools_enabled=tuple(E.TOOLS_ENABLED),
    lease_seconds=E.LEASE_SECONDS,
    heartbeat_seconds=E.HEARTBEAT_SECONDS,
    sweep_seconds=E.SWEEP_SECONDS,
    requeue_grace_seconds=E.REQUEUE_GRACE_SECONDS,
    signal_resend_seconds=E.SIGNAL_RESEND_SECONDS,
    max_attempts=E.MAX_ATTEMPTS,
    steer_queue_cap=E.STEER_QUEUE_CAP,
    agent_def_max_definition_bytes=E.AGENT_DEF_MAX_DEFINITION_BYTES,
    agent_def_max_description_bytes=E.AGENT_DEF_MAX_DESCRIPTION_BYTES,
    skill_def_max_body_bytes=E.SKILL_DEF_MAX_BODY_BYTES,
    operator_token_pepper=_PEPPER,
    operator_token_rotation_grace_seconds=E.OPERATOR_TOKEN_ROTATION_GRACE_SECONDS,
    audit_log_path=E.AUDIT_LOG_PATH or str(E.DATA_DIR / "audit.jsonl"),
    http_host_allowlist=tuple(E.HTTP_HOST_ALLOWLIST),
    http_private_host_allowlist=tuple(E.HTTP_PRIVATE_HOST_ALLOWLIST),
    http_caller_authoritative=E.HTTP_CALLER_AUTHORITATIVE,
    max_streams_per_principal=E.MAX_STREAMS_PER_PRINCIPAL,
    mock_enabled=_MOCK_ENABLED,
    max_stream_seconds=E.MAX_STREAM_SECONDS,
    engine_admission_slots=E.ENGINE_ADMISSION_SLOTS,
    engine_admission_tools_after_ms=E.ENGINE_ADMISSION_TOOLS_AFTER_MS,
    engine_timings_key=E.ENGINE_TIMINGS_KEY,
    auth_cache_ttl_seconds=E.AUTH_CACHE_TTL_SECONDS,
    auth_epoch_check_ms=E.AUTH_EPOCH_CHECK_MS,
    mock_latency_ms=E.MOCK_LATENCY_MS,
    mock_latency_jitter_ms=E.MOCK_LATENCY_JITTER_MS,
    mock_429_rate=E.MOCK_429_RATE,
    mock_500_rate=E.MOCK_500_RATE,
    mock_allow_crash=E.MOCK_ALLOW_CRASH,
    fast_transport=E.FAST_TRANSPORT,
    provider_keys=dict(E.PROVIDER_KEYS),  # a copy; typed read-only (Mapping) on the object
    anthropic_base_url=E.ANTHROPIC_BASE_URL,
    openai_base_url=E.OPENAI_BASE_URL,
    deepseek_base_url=E.DEEPSEEK_BASE_URL,
    gemini_base_url=E.GEMINI_BASE_URL,
    ollama_base_url=E.OLLAMA_BASE_URL,
    ollama_cloud_base_url=E.OLLAMA_CLOUD_BASE_URL,
    voyage_base_url=E.VOYAGE_BASE_URL,
    provider_connect_timeout_ms=E.PROVIDER_CONNECT_TIMEOUT_MS,
    provider_read_timeout_ms=E.PROVIDER_READ_TIMEOUT_MS,
    local_provider_read_timeout_ms=E.LOCAL_PROVIDER_READ_TIMEOUT_MS,
    fallback_pin_after_success=E.FALLBACK_PIN_AFTER_SUCCESS,
    max_concurrent_runs_per_user=E.MAX_CONCURRENT_RUNS_PER_USER,
    max_concurrent_runs_per_tenant=E.MAX_CONCURRENT_RUNS_PER_TENANT,
    max_concurrent_children_cap=E.MAX_CONCURRENT_CHILDREN_CAP,
    tenant_max_definitions=E.TENANT_MAX_DEFINITIONS,
    tenant_max_schedules=E.TENANT_MAX_SCHEDULES,
    tenant_max_channels=E.TENANT_MAX_CHANNELS,
    tenant_max_volumes=E.TENANT_MAX_VOLUMES,
    tenant_schedule_min_period_seconds=E.TENANT_SCHEDULE_MIN_PERIOD_SECONDS,
    operator_key_restriction=E.OPERATOR_KEY_RESTRICTION,
    provider_queue_timeout_ms=E.PROVIDER_QUEUE_TIMEOUT_MS,
    max_concurrent_runs=E.MAX_CONCURRENT_RUNS,
    max_queue_depth=E.MAX_QUEUE_DEPTH,
    queue_timeout_ms=E.QUEUE_TIMEOUT_MS,
    gateway_audit_retention_days=E.GATEWAY_AUDIT_RETENTION_DAYS,
    retention_days=E.RETENTION_DAYS,
    retention_batch=E.RETENTION_BATCH,
    retention_max_batches=E.RETENTION_MAX_BATCHES,
    retention_sweep_seconds=E.RETENTION_SWEEP_SECONDS,
    erasure_batch=E.ERASURE_BATCH,
    embedder=E.EMBEDDER,
    memory_embed_timeout_ms=E.MEMORY_EMBED_TIMEOUT_MS,
    memory_embed_batch_size=E.MEMORY_EMBED_BATCH_SIZE,
    memory_max_value_bytes=E.MEMORY_MAX_VALUE_BYTES,
    memory_max_scope_bytes=E.MEMORY_MAX_SCOPE_BYTES,
    memory_sweep_ms=E.MEMORY_SWEEP_MS,
    channels_max_value_bytes=E.CHANNELS_MAX_VALUE_BYTES,
    channels_longpoll_cap_ms=E.CHANNELS_LONGPOLL_CAP_MS,
    channels_sweep_ms=E.CHANNELS_SWEEP_MS,
    channels_wake_tick_ms=E.CHANNELS_WAKE_TICK_MS,
    interruption_default_timeout_ms=E.INTERRUPTION_DEFAULT_TIMEOUT_MS,
    interruption_max_timeout_ms=E.INTERRUPTION_MAX_TIMEOUT_MS,
    interruption_max_pending=E.INTERRUPTION_MAX_PENDING,
    context_window_default=E.CONTEXT_WINDOW_DEFAULT,
    interruption_sweep_ms=E.INTERRUPTION_SWEEP_MS,
    resident_child_idle_ttl_seconds=E.RESIDENT_CHILD_IDLE_TTL_SECONDS,
    resident_max_children=E.RESIDENT_MAX_CHILDREN,
    mcp_wait_cap_ms=E.MCP_WAIT_CAP_MS,
    evaluation_max_judgement_bytes=E.EVALUATION_MAX_JUDGEMENT_BYTES,
    evaluation_max_rationale_bytes=E.EVALUATION_MAX_RATIONALE_BYTES,
    redact_secrets=E.REDACT_SECRETS,
    hooks_permit_host_widen=tuple(E.HOOKS_PERMIT_HOST_WIDEN),
    hooks_max_per_tenant=E.HOOKS_MAX_PER_TENANT,
    hooks_chain_budget_ms=E.HOOKS_CHAIN_BUDGET_MS,
    webhooks_enabled=E.WEBHOOKS_ENABLED,
    webhooks_allow_unauthenticated=E.WEBHOOKS_ALLOW_UNAUTHENTICATED,
    webhooks_env_allowlist=tuple(E.WEBHOOKS_ENV_ALLOWLIST),
    webhooks_delivery_retention_hours=E.WEBHOOKS_DELIVERY_RETENTION_HOURS,
    a2a_enabled=E.A2A_ENABLED,
    a2a_call_inline_seconds=E.A2A_CALL_INLINE_SECONDS,
    a2a_call_poll_seconds=E.A2A_CALL_POLL_SECONDS,
    a2a_call_timeout_seconds=E.A2A_CALL_TIMEOUT_SECONDS,
    run_webhook_secret=E.RUN_WEBHOOK_SECRET,
    run_webhook_max_attempts=E.RUN_WEBHOOK_MAX_ATTEMPTS,
    run_webhook_timeout_ms=E.RUN_WEBHOOK_TIMEOUT_MS,
    volumes_root=E.VOLUMES_ROOT,
    bash_enabled=E.BASH_ENABLED,
    bash_allowed_creds=E.BASH_ALLOWED_CREDS,
    bash_bwrap=E.BASH_BWRAP,
    bash_unsandboxed=E.BASH_UNSANDBOXED,
    bash_sandbox_uid=E.BASH_SANDBOX_UID,
    bash_limit_cpu_seconds=E.BASH_LIMIT_CPU_SECONDS,
    bash_limit_memory_bytes=E.BASH_LIMIT_MEMORY_BYTES,
    bash_limit_processes=E.BASH_LIMIT_PROCESSES,
    bash_limit_file_bytes=E.BASH_LIMIT_FILE_BYTES,
    bash_limit_open_files=E.BASH_LIMIT_OPEN_FILES,
    bash_tenants=tuple(E.BASH_TENANTS),
    data_dir=str(E.DATA_DIR),
    scheduler_enabled=E.SCHEDULER_ENABLED,
    scheduler_tick_seconds=E.SCHEDULER_TICK_SECONDS,
    scheduler_env_allowlist=tuple(E.SCHEDULER_ENV_ALLOWLIST),
    tenant_credential_env=E.TENANT_CREDENTIAL_ENV,
    triggers_retention_days=E.TRIGGERS_RETENTION_DAYS,
    mcp_call_timeout_seconds=E.MCP_CALL_TIMEOUT_SECONDS,
    mcp_discovery_timeout_seconds=E.MCP_DISCOVERY_TIMEOUT_SECONDS,
    mcp_max_stdio_processes=E.MCP_MAX_STDIO_PROCESSES,
    mcp_max_response_bytes=E.MCP_MAX_RESPONSE_BYTES,
    grpc_addr=E.GRPC_ADDR,
    grpc_max_recv_bytes=E.GRPC_MAX_RECV_BYTES,
    grpc_max_send_bytes=E.GRPC_MAX_SEND_BYTES,
    grpc_keepalive_time_ms=E.GRPC_KEEPALIVE_TIME_MS,
    grpc_keepalive_timeout_ms=E.GRPC_KEEPALIVE_TIMEOUT_MS,
    grpc_min_ping_interval_ms=E.GRPC_MIN_PING_INTERVAL_MS,
    metrics_enabled=E.METRICS_ENABLED,
    metrics_tenant_labels=E.METRICS_TENANT_LABELS,
    replica_id=E.REPLICA_ID,
    allowed_hosts=tuple(E.ALLOWED_HOSTS),
    beat_heartbeat_file=E.BEAT_HEARTBEAT_FILE,
    tracing_exporters=E.TRACING_EXPORTERS,
    snapshot_max_bytes=E.SNAPSHOT_MAX_BYTES,
    worker_version=E.WORKER_VERSION,
)

# Beat's periods, from the knobs above (read once: beat's schedule is fixed when it starts).
CELERY_BEAT_SCHEDULE = beat_schedule(
    sweep_s=LOOMCYCLE.sweep_seconds,
    memory_sweep_s=LOOMCYCLE.memory_sweep_ms / 1000.0,
    channels_wake_tick_s=LOOMCYCLE.channels_wake_tick_ms / 1000.0,
    channels_sweep_s=LOOMCYCLE.channels_sweep_ms / 1000.0,
    interrupts_sweep_s=LOOMCYCLE.interruption_sweep_ms / 1000.0,
    scheduler_tick_s=LOOMCYCLE.scheduler_tick_seconds if LOOMCYCLE.scheduler_enabled else None,
    retention_sweep_s=float(LOOMCYCLE.retention_sweep_seconds),
    a2a_poll_s=float(LOOMCYCLE.a2a_call_poll_seconds),
)


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """Every process logs to stderr, one line per record: text (`plain`), or a JSON object
    (`json`: timestamp, level, logger, message, and run_id, tenant, step and trace_id when
    known, filled by apps.core.logcontext)."""
    console: dict[str, Any] = {"class": "logging.StreamHandler", "formatter": log_format}
    if log_format == "json":
        console["filters"] = ["run_context"]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": ["levelname", "name", "message"],
                "rename_fields": {"levelname": "level", "name": "logger"},
                "timestamp": True,
            },
        },
        "filters": {"run_context": {"()": "apps.core.logcontext.RunContextFilter"}},
        "handlers": {"console": console},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django.db.backends": {"level": "WARNING"},
            # Their DEBUG records are wire traces that quote response headers, where a service
            # may echo a run's credential (HTTP tool: httpcore; MCP client: httpcore2).
            "httpcore": {"level": "INFO"},
            "httpcore2": {"level": "INFO"},
        },
    }


LOGGING = logging_config(E.LOG_FORMAT, E.LOG_LEVEL)
if E.LOG_FORMAT == "json":
    logging.captureWarnings(True)  # Python warnings become records (logger py.warnings): JSON lines too
