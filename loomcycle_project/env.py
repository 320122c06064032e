"""The one place that reads the process environment.

Everything configurable comes from here (django-environ). No secret has a
default; absent optional secrets are None. `settings.py` turns what is read
here into Django settings, the runtime's own knobs into one typed object,
`settings.LOOMCYCLE` (`RuntimeSettings` below), which is how apps and workers
see configuration: they never import this module (an import-linter contract
in pyproject.toml). Only loomcycle_project (settings, the embedded bootstrap,
the management commands) does. The one other environment read is a key
variable a configuration names (`api_key_env`, `${NAME}` references), which
apps.core.secrets reads where it is used.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from apps.core.secrets import PROVIDER_KEY_NAMES
from loomcycle_project import instance_secrets

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# Where the embedded Postgres/Redis and beat state live.
DATA_DIR = Path(env.str("LOOMCYCLE_DATA_DIR", default=str(BASE_DIR / ".loomcycle"))).resolve()


def database_url() -> str | None:
    """Read when settings load, not at import: the embedded bootstrap may set it later."""
    return env.str("DATABASE_URL", default=None) or None


def redis_url() -> str | None:
    return env.str("REDIS_URL", default=None) or None


LISTEN_ADDR: str = env.str("LOOMCYCLE_LISTEN_ADDR", default="127.0.0.1:8787")
AUTH_TOKEN: str | None = env.str("LOOMCYCLE_AUTH_TOKEN", default=None) or None
# Host names the web process answers to. Default: any; while the runtime is in
# open mode, loopback names (and names listed here) only: a DNS-rebinding page
# must not reach the open API (apps.substrate.openmode, decided per request).
ALLOWED_HOSTS: list[str] = [h.strip() for h in env.list("LOOMCYCLE_ALLOWED_HOSTS", default=[]) if h.strip()]


@functools.cache
def _generated_secrets() -> dict[str, str]:
    """The data directory's secrets file, read once (when settings load, after
    manage.py may have written it)."""
    return instance_secrets.load(DATA_DIR)


def secret_key() -> tuple[str | None, str]:
    """Django's SECRET_KEY and where it came from: DJANGO_SECRET_KEY, else the
    data directory's generated secrets file (read when settings load: manage.py
    may have just written it), else none."""
    value = env.str("DJANGO_SECRET_KEY", default=None)
    if value:
        return value, "env"
    generated = _generated_secrets().get("secret_key")
    return (generated, "file") if generated else (None, "none")


def operator_token_pepper() -> tuple[str, str]:
    """The token pepper and its source, as `secret_key` (set but empty in the env counts as set)."""
    value = os.environ.get("LOOMCYCLE_OPERATOR_TOKEN_PEPPER")  # django-environ reads "" as unset
    if value is not None:
        return value, "env"
    generated = _generated_secrets().get("operator_token_pepper")
    return (generated, "file") if generated is not None else ("", "none")


DEBUG: bool = env.bool("LOOMCYCLE_DEBUG", default=False)


def _list(name: str, default: list[str]) -> list[str]:
    """Comma-separated, items trimmed, empty items dropped."""
    return [item.strip() for item in env.list(name, default=default) if item.strip()]


def _at_least(name: str, default: int, minimum: int) -> int:
    """An integer variable that must be at least `minimum`: start-up fails with a clear message otherwise."""
    value: int = env.int(name, default=default)
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} (got {value})")
    return value


def _float_at_least(name: str, default: float, minimum: float) -> float:
    """A number variable that must be at least `minimum`: start-up fails with a clear message otherwise."""
    value: float = env.float(name, default=default)
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum:g} (got {value:g})")
    return value


def split_paths(raw: str) -> list[str]:
    """A path list separated by `:` (loomcycle's form) or `,` (ours, kept), mixed
    freely; items trimmed, empty items dropped. A path containing either can't be listed."""
    return [item.strip() for item in re.split(r"[:,]", raw) if item.strip()]


# yaml layers (apps.core.config): the directory's *.yaml/*.yml, sorted, then the files in order.
CONFIG_FILES: list[str] = split_paths(env.str("LOOMCYCLE_CONFIG_FILES", default=""))
CONFIG_DIR: str = env.str("LOOMCYCLE_CONFIG_DIR", default="").strip()
# Embedded configuration units layered beneath the files (apps.core.presets), in order.
PRESETS: list[str] = [n.strip() for n in env.list("LOOMCYCLE_PRESETS", default=[]) if n.strip()]
# A value set by one layer and changed by a later one is an error (config_conflict), not a log line.
CONFIG_STRICT: bool = env.bool("LOOMCYCLE_CONFIG_STRICT", default=False)
# Markdown definitions read at boot under the yaml (apps.substrate.discovery): <name>.md, <name>/SKILL.md.
AGENTS_ROOT: str = env.str("LOOMCYCLE_AGENTS_ROOT", default="").strip()
SKILLS_ROOT: str = env.str("LOOMCYCLE_SKILLS_ROOT", default="").strip()
MAX_REQUEST_BYTES: int = env.int("LOOMCYCLE_MAX_REQUEST_BYTES", default=16 * 1024 * 1024)
# An `image` prompt block: its decoded size cap (Anthropic's own per-image limit), and how long
# fetching one given by URL may take (apps.gateway.images).
MAX_IMAGE_BYTES: int = env.int("LOOMCYCLE_MAX_IMAGE_BYTES", default=5 * 1024 * 1024)
IMAGE_FETCH_TIMEOUT_MS: int = env.int("LOOMCYCLE_IMAGE_FETCH_TIMEOUT_MS", default=10_000)
SSE_KEEPALIVE_MS: int = env.int("LOOMCYCLE_SSE_KEEPALIVE_MS", default=20_000)
TOOL_PARALLELISM: int = env.int("LOOMCYCLE_TOOL_PARALLELISM", default=8)
# Operator floor of enabled tools ("*" = every registered tool).
TOOLS_ENABLED: list[str] = _list("LOOMCYCLE_TOOLS_ENABLED", ["*"])

# Engine knobs (see docs/configuration.md).
LEASE_SECONDS: float = env.float("LOOMCYCLE_LEASE_SECONDS", default=30.0)
HEARTBEAT_SECONDS: float = env.float("LOOMCYCLE_HEARTBEAT_SECONDS", default=10.0)
SWEEP_SECONDS: float = env.float("LOOMCYCLE_SWEEP_SECONDS", default=15.0)
REQUEUE_GRACE_SECONDS: float = env.float("LOOMCYCLE_REQUEUE_GRACE_SECONDS", default=120.0)
# A lifecycle signal's outbox row older than this is re-sent by the lease sweep (apps.runs.signals);
# at least 1 s, so a row is never re-sent while its own process is still delivering it right after the commit.
SIGNAL_RESEND_SECONDS: float = _float_at_least("LOOMCYCLE_SIGNAL_RESEND_SECONDS", 30.0, 1.0)
MAX_ATTEMPTS: int = env.int("LOOMCYCLE_MAX_ATTEMPTS", default=3)
STEER_QUEUE_CAP: int = env.int("LOOMCYCLE_STEER_QUEUE_CAP", default=16)
PG_POOL_MAX: int = env.int("LOOMCYCLE_PG_POOL_MAX", default=16)
# How long a database connection may go unanswered by the network (connect, unacknowledged data,
# keepalive probes on an idle or waiting connection) before libpq drops it; 0 = the OS defaults
# (a cut link then holds a request for as long as TCP retransmits: about 15 minutes on Linux).
PG_NETWORK_TIMEOUT_SECONDS: int = env.int("LOOMCYCLE_PG_NETWORK_TIMEOUT_SECONDS", default=10)

# The user's own Django apps (dotted module or AppConfig paths), appended to INSTALLED_APPS in
# every process that loads the settings: web, workers, beat, manage.py (docs/extending.md).
EXTRA_APPS: list[str] = _list("LOOMCYCLE_EXTRA_APPS", [])


def checked_apps(paths: list[str]) -> list[str]:
    """`paths` unchanged when each names an importable module (an app package, or the
    module of an AppConfig class path); otherwise start-up fails naming the bad entry.
    Only the module is located here (find_spec): importing an app before Django is set
    up could touch its models too early."""
    for path in paths:
        if not _module_found(path) and not _app_config_path(path):
            raise ImproperlyConfigured(
                f"LOOMCYCLE_EXTRA_APPS: no module {path!r} (expected a dotted path to a Django app "
                "package or to its AppConfig class, importable from the runtime's directory or PYTHONPATH)"
            )
    return paths


def _app_config_path(path: str) -> bool:
    """`module.ClassName` with an importable module: an AppConfig class is CapWords (PEP 8, as Django's
    own are), so a mistyped package under an existing one (`examples.hostap`) is not taken for a class."""
    module, _, name = path.rpartition(".")
    return name[:1].isupper() and _module_found(module)


def _module_found(path: str) -> bool:
    if not path or not all(part.isidentifier() for part in path.split(".")):
        return False
    try:
        return importlib.util.find_spec(path) is not None
    except ImportError:  # a missing parent package
        return False


# Processes started by `manage.py up`.
WORKER_PROCESSES: int = env.int("LOOMCYCLE_WORKER_PROCESSES", default=2)
# Daphne processes sharing the listening socket (`up` binds it once and hands it down).
WEB_PROCESSES: int = env.int("LOOMCYCLE_WEB_PROCESSES", default=1)
# Threads per worker process. A run holds its thread through its provider call (its database
# connection handed back first) and admission lets only ENGINE_ADMISSION_SLOTS of them do engine
# work at once, so a waiting thread costs memory only (~90 KiB of RSS): 2 processes x 2,560 hold
# 5,120 model calls at once (docs/performance.md, "Thousands of model calls in flight").
WORKER_CONCURRENCY: int = env.int("LOOMCYCLE_WORKER_CONCURRENCY", default=2560)
FLOWER_PORT: int = env.int("LOOMCYCLE_FLOWER_PORT", default=5555)
FLOWER_ENABLED: bool = env.bool("LOOMCYCLE_FLOWER_ENABLED", default=True)
# Flower listens on loopback; another address needs basic auth ("user:password[,user2:password2]").
FLOWER_ADDRESS: str = env.str("LOOMCYCLE_FLOWER_ADDRESS", default="127.0.0.1")
FLOWER_BASIC_AUTH: str = env.str("LOOMCYCLE_FLOWER_BASIC_AUTH", default="")
# Browser cookies (the admin's session and CSRF cookies) are Secure on every
# request Django sees as HTTPS. Behind a TLS-terminating proxy, name the header
# it sets (e.g. "X-Forwarded-Proto"; the proxy must overwrite a client's own);
# LOOMCYCLE_COOKIE_SECURE=1 marks them Secure always.
SECURE_PROXY_SSL_HEADER: str = env.str("LOOMCYCLE_SECURE_PROXY_SSL_HEADER", default="")
COOKIE_SECURE: bool = env.bool("LOOMCYCLE_COOKIE_SECURE", default=False)

# Mock provider (SPEC 7.5).


def embedded_default() -> bool:
    """Running on the embedded Postgres: no DATABASE_URL was given, or manage.py
    or the pytest plugin filled it with the embedded server (and said so)."""
    return env.bool("LOOMCYCLE_EMBEDDED_POSTGRES", default=False) or not database_url()


def mock_enabled() -> tuple[bool, str]:
    """Whether the mock providers are registered, and why: LOOMCYCLE_MOCK_ENABLED
    when set, else on for the embedded default only (a production configuration
    on external servers must ask for the mock explicitly)."""
    if env.str("LOOMCYCLE_MOCK_ENABLED", default=""):
        return env.bool("LOOMCYCLE_MOCK_ENABLED"), "LOOMCYCLE_MOCK_ENABLED"
    return embedded_default(), "embedded default" if embedded_default() else "external DATABASE_URL"


MOCK_LATENCY_MS: float = env.float("LOOMCYCLE_MOCK_LATENCY_MS", default=50.0)
MOCK_LATENCY_JITTER_MS: float = env.float("LOOMCYCLE_MOCK_LATENCY_JITTER_MS", default=25.0)
MOCK_429_RATE: float = env.float("LOOMCYCLE_MOCK_429_RATE", default=0.0)
MOCK_500_RATE: float = env.float("LOOMCYCLE_MOCK_500_RATE", default=0.0)
# Lets the `mock-crash` model kill its worker (crash-recovery tests only).
MOCK_ALLOW_CRASH: bool = env.bool("LOOMCYCLE_MOCK_ALLOW_CRASH", default=False)

# Engine admission (apps/runs/engine/admission.py): iterations doing engine work at
# once per worker process (0 = no limit: every pool thread runs its iteration
# at once), and how long a batch of tool calls keeps its slot before a queued
# iteration may take it (remote provider calls give theirs up at once).
ENGINE_ADMISSION_SLOTS: int = env.int("LOOMCYCLE_ENGINE_ADMISSION_SLOTS", default=2)
ENGINE_ADMISSION_TOOLS_AFTER_MS: float = env.float("LOOMCYCLE_ENGINE_ADMISSION_TOOLS_AFTER_MS", default=20.0)

# The tuned broker transport (workers/transport.py, chosen by its dotted path) and
# hand-built doorbells (workers/doorbell.py). Off: kombu's stock Redis transport
# and Celery's send_task, the fallback when a kombu upgrade breaks the fast path.
FAST_TRANSPORT: bool = env.bool("LOOMCYCLE_FAST_TRANSPORT", default=True)

# Opt-in engine timing samples: each iteration's "total_ms,provider_ms" is
# pushed to this Redis list, in batches every 100 ms (bench/loop.py reads it). Off when unset.
ENGINE_TIMINGS_KEY: str | None = env.str("LOOMCYCLE_ENGINE_TIMINGS_KEY", default=None) or None

# Substrate (SPEC 5.2, 8): definition size caps (0 = no cap) and operator tokens.
AGENT_DEF_MAX_DEFINITION_BYTES: int = env.int("LOOMCYCLE_AGENT_DEF_MAX_DEFINITION_BYTES", default=262_144)
AGENT_DEF_MAX_DESCRIPTION_BYTES: int = env.int("LOOMCYCLE_AGENT_DEF_MAX_DESCRIPTION_BYTES", default=16_384)
SKILL_DEF_MAX_BODY_BYTES: int = env.int("LOOMCYCLE_SKILL_DEF_MAX_BODY_BYTES", default=262_144)
# How long a web process trusts a token lookup (a token write anywhere voids it within ~1 s).
AUTH_CACHE_TTL_SECONDS: float = env.float("LOOMCYCLE_AUTH_CACHE_TTL_SECONDS", default=30.0)
# How often a process re-reads the Redis auth epoch that token writes bump (0 = every request).
AUTH_EPOCH_CHECK_MS: int = env.int("LOOMCYCLE_AUTH_EPOCH_CHECK_MS", default=1000)
OPERATOR_TOKEN_ROTATION_GRACE_SECONDS: int = env.int("LOOMCYCLE_OPERATOR_TOKEN_ROTATION_GRACE_SECONDS", default=86_400)
AUDIT_LOG_PATH: str = env.str("LOOMCYCLE_AUDIT_LOG_PATH", default="")
HTTP_HOST_ALLOWLIST: list[str] = _list("LOOMCYCLE_HTTP_HOST_ALLOWLIST", [])
# SSRF guard (apps.core.egress): hosts that may resolve to non-public addresses.
HTTP_PRIVATE_HOST_ALLOWLIST: list[str] = _list("LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST", [])
# SPEC 6.1: the caller's allowed_hosts is the run's host list (still within a non-empty operator list).
HTTP_CALLER_AUTHORITATIVE: bool = env.bool("LOOMCYCLE_HTTP_CALLER_AUTHORITATIVE", default=False)

LOG_LEVEL: str = env.str("LOOMCYCLE_LOG_LEVEL", default="INFO")
LOG_FORMATS = ("plain", "json")


def _log_format() -> str:
    """LOOMCYCLE_LOG_FORMAT: `plain` (the default: one text line per record) or `json` (one
    JSON object per line, with the run's ids where known: apps.core.logcontext)."""
    value: str = env.str("LOOMCYCLE_LOG_FORMAT", default="plain").strip().lower()
    if value not in LOG_FORMATS:
        raise ImproperlyConfigured(f"LOOMCYCLE_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)} (got {value!r})")
    return value


LOG_FORMAT: str = _log_format()

PROVIDER_KEYS = {name: env.str(name, default=None) or None for name in PROVIDER_KEY_NAMES}
# Provider endpoints (SPEC C.2). OLLAMA_BASE_URL=disabled opts out of the local Ollama.
ANTHROPIC_BASE_URL: str = env.str("ANTHROPIC_BASE_URL", default="https://api.anthropic.com")
OPENAI_BASE_URL: str = env.str("OPENAI_BASE_URL", default="https://api.openai.com/v1")
DEEPSEEK_BASE_URL: str = env.str("DEEPSEEK_BASE_URL", default="https://api.deepseek.com/v1")
GEMINI_BASE_URL: str = env.str("GEMINI_BASE_URL", default="https://generativelanguage.googleapis.com/v1beta")
OLLAMA_BASE_URL: str = env.str("OLLAMA_BASE_URL", default="http://localhost:11434")
OLLAMA_CLOUD_BASE_URL: str = env.str("OLLAMA_CLOUD_BASE_URL", default="https://ollama.com")
VOYAGE_BASE_URL: str = env.str("VOYAGE_BASE_URL", default="https://api.voyageai.com/v1")
# Provider HTTP timeouts: connect, and the wait for the first byte / between
# bytes (local models get the long one: loading a model can take minutes).
PROVIDER_CONNECT_TIMEOUT_MS: int = env.int("LOOMCYCLE_PROVIDER_CONNECT_TIMEOUT_MS", default=10_000)
PROVIDER_READ_TIMEOUT_MS: int = env.int("LOOMCYCLE_PROVIDER_READ_TIMEOUT_MS", default=120_000)
LOCAL_PROVIDER_READ_TIMEOUT_MS: int = env.int("LOOMCYCLE_LOCAL_PROVIDER_READ_TIMEOUT_MS", default=600_000)
# Fallback (SPEC 7.4): after a run's first successful model turn, never switch provider.
FALLBACK_PIN_AFTER_SUCCESS: bool = env.bool("LOOMCYCLE_FALLBACK_PIN_AFTER_SUCCESS", default=False)

# Fairness (SPEC 9.6), cluster-wide through Redis: live runs of one user / one tenant, every
# descendant (sub-agent, parallel_spawn child, batch item) counted with its root. 0 = off.
# yaml `concurrency:` may set them too.
MAX_CONCURRENT_RUNS_PER_USER: int = env.int("LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER", default=64)
MAX_CONCURRENT_RUNS_PER_TENANT: int = env.int("LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT", default=256)
# The highest `max_concurrent_children` an agent may have (a tenant's definition asking for more is
# refused; a yaml agent's is cut to it when it runs).
MAX_CONCURRENT_CHILDREN_CAP: int = _at_least("LOOMCYCLE_MAX_CONCURRENT_CHILDREN_CAP", 8, 1)
# Per-tenant counts (apps.substrate.quotas, apps.channels, apps.tools): names of one definition kind,
# of ScheduleDefs, runtime channels and dynamic volumes; the yaml is exempt. And the shortest period
# a tenant's ScheduleDef cron may fire at (the yaml's may fire every minute).
TENANT_MAX_DEFINITIONS: int = _at_least("LOOMCYCLE_TENANT_MAX_DEFINITIONS", 500, 1)
TENANT_MAX_SCHEDULES: int = _at_least("LOOMCYCLE_TENANT_MAX_SCHEDULES", 50, 1)
TENANT_MAX_CHANNELS: int = _at_least("LOOMCYCLE_TENANT_MAX_CHANNELS", 500, 1)
TENANT_MAX_VOLUMES: int = _at_least("LOOMCYCLE_TENANT_MAX_VOLUMES", 50, 1)
TENANT_SCHEDULE_MIN_PERIOD_SECONDS: int = _at_least("LOOMCYCLE_TENANT_SCHEDULE_MIN_PERIOD_SECONDS", 300, 60)
# The gateway spends the operator's provider keys only for principals with providers:operator-key.
OPERATOR_KEY_RESTRICTION: bool = env.bool("LOOMCYCLE_OPERATOR_KEY_RESTRICTION", default=True)
PROVIDER_QUEUE_TIMEOUT_MS: int = env.int("LOOMCYCLE_PROVIDER_QUEUE_TIMEOUT_MS", default=30_000)
# Event streams (SSE and WebSocket) one principal may hold open at once, cluster-wide (0 = no cap),
# and the longest a stream stays open before the server ends it (0 = no limit; clients re-attach).
MAX_STREAMS_PER_PRINCIPAL: int = env.int("LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL", default=64)
MAX_STREAM_SECONDS: int = env.int("LOOMCYCLE_MAX_STREAM_SECONDS", default=3600)
# Admission backpressure (loomcycle's global semaphore, here cluster-wide in Postgres): live
# top-level runs admitted at once (0 = off), runs waiting for a slot before 429 `backpressure`,
# and how long a streaming POST /v1/runs waits for its slot. yaml `concurrency:` may set them too.
MAX_CONCURRENT_RUNS: int = env.int("LOOMCYCLE_MAX_CONCURRENT_RUNS", default=0)
MAX_QUEUE_DEPTH: int = env.int("LOOMCYCLE_MAX_QUEUE_DEPTH", default=16)
QUEUE_TIMEOUT_MS: int = env.int("LOOMCYCLE_QUEUE_TIMEOUT_MS", default=30_000)

# Gateway audit rows (one per /v1/chat/completions, /v1/_llm/chat, /v1/embeddings call).
GATEWAY_AUDIT_RETENTION_DAYS: int = env.int("LOOMCYCLE_GATEWAY_AUDIT_RETENTION_DAYS", default=30)
# Data lifecycle (apps.lifecycle, docs/operations.md "Data lifecycle"): ended runs are deleted this
# many days after they end unless yaml/`/v1/_retention` says otherwise (0: kept forever); the sweep
# deletes at most BATCH trees per transaction-sized batch and MAX_BATCHES batches per pass.
RETENTION_DAYS: int = env.int("LOOMCYCLE_RETENTION_DAYS", default=0)
RETENTION_BATCH: int = max(1, env.int("LOOMCYCLE_RETENTION_BATCH", default=50))
RETENTION_MAX_BATCHES: int = max(1, env.int("LOOMCYCLE_RETENTION_MAX_BATCHES", default=40))
RETENTION_SWEEP_SECONDS: int = max(1, env.int("LOOMCYCLE_RETENTION_SWEEP_SECONDS", default=300))
ERASURE_BATCH: int = max(1, env.int("LOOMCYCLE_ERASURE_BATCH", default=50))
# Embedder when yaml `memory.embedder` is absent: "hashing" (offline, deterministic), or "none".
EMBEDDER: str = env.str("LOOMCYCLE_EMBEDDER", default="hashing")
MEMORY_EMBED_TIMEOUT_MS: int = env.int("LOOMCYCLE_MEMORY_EMBED_TIMEOUT_MS", default=30_000)
MEMORY_EMBED_BATCH_SIZE: int = env.int("LOOMCYCLE_MEMORY_EMBED_BATCH_SIZE", default=100)
# Memory limits (SPEC 6.2): one value's JSON bytes; a (scope, scope_id)'s sum of key + value bytes
# (an agent's `memory_quota_bytes` overrides it); how often beat deletes expired rows.
MEMORY_MAX_VALUE_BYTES: int = env.int("LOOMCYCLE_MEMORY_MAX_VALUE_BYTES", default=65_536)
MEMORY_MAX_SCOPE_BYTES: int = env.int("LOOMCYCLE_MEMORY_MAX_SCOPE_BYTES", default=1_048_576)
MEMORY_SWEEP_MS: int = env.int("LOOMCYCLE_MEMORY_SWEEP_MS", default=900_000)
# Channels (SPEC 6.3, 9.4): one payload's JSON bytes (0: no cap); the longest wait a subscribe/await
# may ask for (a longer wait_ms is cut to it; 0 disables waiting); how often beat deletes expired
# messages; how often beat answers parked waits whose deadline (or deferred message) is due.
CHANNELS_MAX_VALUE_BYTES: int = env.int("LOOMCYCLE_CHANNELS_MAX_VALUE_BYTES", default=65_536)
CHANNELS_LONGPOLL_CAP_MS: int = env.int("LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS", default=30_000)
CHANNELS_SWEEP_MS: int = env.int("LOOMCYCLE_CHANNELS_SWEEP_MS", default=900_000)
CHANNELS_WAKE_TICK_MS: int = env.int("LOOMCYCLE_CHANNELS_WAKE_TICK_MS", default=1000)
# Interruptions (SPEC 6.7): an ask's timeout when it gives none, the longest it may ask for,
# how many asks of one run may be pending (an agent's `interruption.max_pending` overrides it),
# and how often beat expires asks past their deadline.
INTERRUPTION_DEFAULT_TIMEOUT_MS: int = _at_least("LOOMCYCLE_INTERRUPTION_DEFAULT_TIMEOUT_MS", 3_600_000, 1)
INTERRUPTION_MAX_TIMEOUT_MS: int = _at_least("LOOMCYCLE_INTERRUPTION_MAX_TIMEOUT_MS", 86_400_000, 1)
if INTERRUPTION_DEFAULT_TIMEOUT_MS > INTERRUPTION_MAX_TIMEOUT_MS:  # else every ask without timeout_ms is refused
    raise ImproperlyConfigured(
        f"LOOMCYCLE_INTERRUPTION_DEFAULT_TIMEOUT_MS ({INTERRUPTION_DEFAULT_TIMEOUT_MS}) is above "
        f"LOOMCYCLE_INTERRUPTION_MAX_TIMEOUT_MS ({INTERRUPTION_MAX_TIMEOUT_MS})"
    )
INTERRUPTION_MAX_PENDING: int = _at_least("LOOMCYCLE_INTERRUPTION_MAX_PENDING", 10, 1)
INTERRUPTION_SWEEP_MS: int = _at_least("LOOMCYCLE_INTERRUPTION_SWEEP_MS", 5000, 100)
# Context compaction (docs/compaction.md): the context window, in tokens, assumed for a model whose
# provider declares none (the mock, Ollama, an HTTP provider without max_context_tokens).
CONTEXT_WINDOW_DEFAULT: int = _at_least("LOOMCYCLE_CONTEXT_WINDOW_DEFAULT", 8192, 1)
# Resident children (Agent op=open, SPEC 4.8): how long one may sit idle (parked between turns)
# before beat closes it, when its open gives no idle_ttl_seconds (loomcycle's 30 min); how many
# one parent may hold open at once (loomcycle's 8).
RESIDENT_CHILD_IDLE_TTL_SECONDS: int = _at_least("LOOMCYCLE_RESIDENT_CHILD_IDLE_TTL_SECONDS", 1800, 1)
RESIDENT_MAX_CHILDREN: int = _at_least("LOOMCYCLE_RESIDENT_MAX_CHILDREN", 8, 1)
# MCP server (apps.mcp.server): the longest a `spawn_run` call with `wait` may hold its request
# open for the run's result (a longer `wait_seconds` is cut to it).
MCP_WAIT_CAP_MS: int = _at_least("LOOMCYCLE_MCP_WAIT_CAP_MS", 120_000, 1)
# Evaluation caps (SPEC 6.6): UTF-8 bytes of one evaluation's judgement and rationale.
EVALUATION_MAX_JUDGEMENT_BYTES: int = env.int("LOOMCYCLE_EVALUATION_MAX_JUDGEMENT_BYTES", default=4096)
EVALUATION_MAX_RATIONALE_BYTES: int = env.int("LOOMCYCLE_EVALUATION_MAX_RATIONALE_BYTES", default=16_384)
# Redaction of env secrets and secret patterns before persisting (apps.core.redact); a run's credentials always.
REDACT_SECRETS: bool = env.bool("LOOMCYCLE_REDACT_SECRETS", default=True)
# Tool-use hooks (SPEC 9.3): the `[tenant:]owner` pairs whose pre hooks may widen a call's
# allowed hosts (`allow_hosts`); none by default (loomcycle's yaml hooks.permit_host_widen.owners).
HOOKS_PERMIT_HOST_WIDEN: list[str] = _list("LOOMCYCLE_HOOKS_PERMIT_HOST_WIDEN", [])
# At most this many registrations per tenant (400 invalid_registration past it), and the
# total time the pre and post chains of one tool call may spend in callbacks.
HOOKS_MAX_PER_TENANT: int = _at_least("LOOMCYCLE_HOOKS_MAX_PER_TENANT", 32, 1)
HOOKS_CHAIN_BUDGET_MS: int = _at_least("LOOMCYCLE_HOOKS_CHAIN_BUDGET_MS", 60_000, 1)
# Observability (docs/operations.md): GET /metrics is served only when enabled; the id this
# process reports in /healthz (`replica_id`) and under which it heartbeats (`replicas[]`),
# the host name when unset.
METRICS_ENABLED: bool = env.bool("LOOMCYCLE_METRICS_ENABLED", default=True)
# The spend counters label at most this many tenants (the biggest spenders); the rest fold into `other`.
METRICS_TENANT_LABELS: int = _at_least("LOOMCYCLE_METRICS_TENANT_LABELS", 20, 1)
REPLICA_ID: str = env.str("LOOMCYCLE_REPLICA_ID", default="")


def _git_commit() -> str | None:
    """The commit of the checkout this code runs from (12 hex digits), or None when
    none is readable: no git binary, not a checkout (an installed package, a
    container image without .git), or git refusing (an unsafe owner)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run(
            [git, "-C", str(BASE_DIR), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):  # git unusable here: the version is the package's alone
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{7,40}", commit) else None


def worker_version() -> str:
    """LOOMCYCLE_WORKER_VERSION, else `<package version>+g<commit>` when the checkout's
    commit is readable, else the package version. Read once per process (settings load):
    every iteration this process commits records it (apps.runs.store.hot)."""
    from loomcycle_project import __version__

    explicit: str = env.str("LOOMCYCLE_WORKER_VERSION", default="").strip()
    if explicit:
        if len(explicit) > WORKER_VERSION_MAX_CHARS:
            raise ImproperlyConfigured(f"LOOMCYCLE_WORKER_VERSION is longer than {WORKER_VERSION_MAX_CHARS} characters")
        return explicit
    commit = _git_commit()
    return f"{__version__}+g{commit}" if commit else __version__


# The code version each iteration records beside its events (docs/operations.md, "Upgrades").
WORKER_VERSION_MAX_CHARS = 64
WORKER_VERSION: str = worker_version()

# The file beat's scheduler keeps fresh from its tick loop (workers/heartbeat.py), which the
# container healthcheck reads (`python -m loomcycle_project.healthcheck beat`).
BEAT_HEARTBEAT_FILE: str = env.str("LOOMCYCLE_BEAT_HEARTBEAT_FILE", default=str(DATA_DIR / "beat-heartbeat"))


# Tracing (docs/operations.md, "Tracing"; loomcycle_project.telemetry). The OpenTelemetry SDK
# reads its own OTEL_* variables (endpoint, headers, sampler, batch delays, service name); these
# three decide only which exporters a process installs: OTLP/HTTP when OTEL_TRACES_EXPORTER names
# `otlp` (its default) and an OTLP endpoint is set, the console exporter when it names `console`,
# none with OTEL_SDK_DISABLED. No exporter: no tracer provider, no instrumentation, no spans.
_TRACES_EXPORTERS = {"otlp", "console", "none"}


def tracing_exporters() -> tuple[str, ...]:
    """The exporters the OTEL_* variables ask for, of those installed (otlp over HTTP, console)."""
    if env.bool("OTEL_SDK_DISABLED", default=False):
        return ()
    endpoint = env.str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", default="") or env.str(
        "OTEL_EXPORTER_OTLP_ENDPOINT", default=""
    )
    names = [n.strip().lower() for n in env.str("OTEL_TRACES_EXPORTER", default="otlp").split(",") if n.strip()]
    unknown = sorted(set(names) - _TRACES_EXPORTERS)
    if unknown:
        raise ImproperlyConfigured(f"OTEL_TRACES_EXPORTER: unknown exporter(s) {unknown}; use otlp, console or none")
    protocol = env.str("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", default="") or env.str(
        "OTEL_EXPORTER_OTLP_PROTOCOL", default="http/protobuf"
    )
    if "otlp" in names and endpoint and protocol != "http/protobuf":
        raise ImproperlyConfigured(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: only http/protobuf is installed")
    return tuple(n for n in ("otlp", "console") if n in names and (n != "otlp" or endpoint))


TRACING_EXPORTERS: tuple[str, ...] = tracing_exporters()
# Snapshots (SPEC 2.4, docs/operations.md "Snapshots"): the largest envelope a capture may build
# and a restore may read, in bytes (SPEC's default 512 MiB); a capture's `max_bytes` may lower it.
SNAPSHOT_MAX_BYTES: int = _at_least("LOOMCYCLE_SNAPSHOT_MAX_BYTES", 536_870_912, 1)
# Inbound webhooks (SPEC 2.10, 9.2; docs/triggers.md): the receiver is mounted only when enabled;
# `auth.kind: none` definitions answer only when unauthenticated mode is on; secret env names a
# definition may read besides LOOMCYCLE_*; how long delivery records (and so dedupe) are kept.
WEBHOOKS_ENABLED: bool = env.bool("LOOMCYCLE_WEBHOOKS_ENABLED", default=False)
WEBHOOKS_ALLOW_UNAUTHENTICATED: bool = env.bool("LOOMCYCLE_WEBHOOKS_ALLOW_UNAUTHENTICATED", default=False)
WEBHOOKS_ENV_ALLOWLIST: list[str] = _list("LOOMCYCLE_WEBHOOKS_ENV_ALLOWLIST", [])
WEBHOOKS_DELIVERY_RETENTION_HOURS: int = _at_least("LOOMCYCLE_WEBHOOKS_DELIVERY_RETENTION_HOURS", 168, 1)
# A2A (SPEC 2.12, docs/a2a.md): the agent cards and JSON-RPC endpoint are mounted only when enabled.
A2A_ENABLED: bool = env.bool("LOOMCYCLE_A2A_ENABLED", default=False)
# The A2A client (an agent's a2a__<peer>__<skill> tools): how long a call is followed inline before
# the run parks on it, how often beat then asks the peer, and when a peer that never answers is given up.
A2A_CALL_INLINE_SECONDS: int = _at_least("LOOMCYCLE_A2A_CALL_INLINE_SECONDS", 30, 1)
A2A_CALL_POLL_SECONDS: int = _at_least("LOOMCYCLE_A2A_CALL_POLL_SECONDS", 5, 1)
A2A_CALL_TIMEOUT_SECONDS: int = _at_least("LOOMCYCLE_A2A_CALL_TIMEOUT_SECONDS", 3600, 1)
# Completion webhooks (outbound, a run's `webhook`; docs/api.md "Completion webhooks"): the signing
# secret of a webhook that names no `secret_ref` (unset: such a webhook is refused at run creation),
# the POST attempts before a delivery is `failed`, and one attempt's timeout.
RUN_WEBHOOK_SECRET: str | None = env.str("LOOMCYCLE_RUN_WEBHOOK_SECRET", default=None) or None
RUN_WEBHOOK_MAX_ATTEMPTS: int = _at_least("LOOMCYCLE_RUN_WEBHOOK_MAX_ATTEMPTS", 10, 1)
RUN_WEBHOOK_TIMEOUT_MS: int = _at_least("LOOMCYCLE_RUN_WEBHOOK_TIMEOUT_MS", 10_000, 100)

# Volumes and the shell (docs/tools.md). Dynamic (per-tenant) and per-run ephemeral
# volumes live under VOLUMES_ROOT and exist only when it is set (or a yaml volume is the
# dynamic_root); Bash is off unless BASH_ENABLED, and its child sees PATH plus the names
# BASH_ALLOWED_CREDS lists (comma-separated), nothing else.
VOLUMES_ROOT: str = env.str("LOOMCYCLE_VOLUMES_ROOT", default="")
BASH_ENABLED: bool = env.bool("LOOMCYCLE_BASH_ENABLED", default=False)
BASH_ALLOWED_CREDS: str = env.str("LOOMCYCLE_BASH_ALLOWED_CREDS", default="")
# Each Bash command runs under bubblewrap (apps.tools.sandbox): without it Bash is refused,
# unless BASH_UNSANDBOXED (the operator's explicit, loudly reported choice) runs it unsandboxed.
BASH_BWRAP: str = env.str("LOOMCYCLE_BASH_BWRAP", default="/usr/bin/bwrap")
BASH_UNSANDBOXED: bool = env.bool("LOOMCYCLE_BASH_UNSANDBOXED", default=False)
BASH_SANDBOX_UID: int = _at_least("LOOMCYCLE_BASH_SANDBOX_UID", 65534, 1)
# Limits of each sandboxed command (setrlimit through util-linux `prlimit`): CPU seconds per
# process, address space per process, processes (beyond what its uid already runs), file size
# (and the size of its private /tmp), open files.
BASH_LIMIT_CPU_SECONDS: int = _at_least("LOOMCYCLE_BASH_LIMIT_CPU_SECONDS", 120, 1)
BASH_LIMIT_MEMORY_BYTES: int = _at_least("LOOMCYCLE_BASH_LIMIT_MEMORY_BYTES", 2 * 1024**3, 1)
BASH_LIMIT_PROCESSES: int = _at_least("LOOMCYCLE_BASH_LIMIT_PROCESSES", 128, 1)
BASH_LIMIT_FILE_BYTES: int = _at_least("LOOMCYCLE_BASH_LIMIT_FILE_BYTES", 256 * 1024**2, 1)
BASH_LIMIT_OPEN_FILES: int = _at_least("LOOMCYCLE_BASH_LIMIT_OPEN_FILES", 256, 1)
# Who may use Bash and the operator's host tools besides agents of the operator's yaml:
# runs of these tenants (apps.core.privileged).
BASH_TENANTS: list[str] = _list("LOOMCYCLE_BASH_TENANTS", [])
# Scheduler (SPEC 9.1): off unless set; how often beat sends the tick that fires due ScheduleDefs.
SCHEDULER_ENABLED: bool = env.bool("LOOMCYCLE_SCHEDULER_ENABLED", default=False)
SCHEDULER_TICK_SECONDS: float = env.float("LOOMCYCLE_SCHEDULER_TICK_SECONDS", default=30.0)
# Variables a ScheduleDef's user_credentials_from_env may read besides LOOMCYCLE_* ones (never infra secrets).
SCHEDULER_ENV_ALLOWLIST: list[str] = _list("LOOMCYCLE_SCHEDULER_ENV_ALLOWLIST", [])


def _tenant_env_allowlist(name: str) -> dict[str, tuple[str, ...]]:
    """`tenant:VARIABLE` pairs, comma-separated: the variables a tenant-owned ScheduleDef or
    WebhookDef may read as credentials (apps.core.secrets.credential_env_refusal)."""
    out: dict[str, set[str]] = {}
    for item in _list(name, []):
        tenant, sep, variable = item.partition(":")
        if not sep or not tenant.strip() or not variable.strip():
            raise ImproperlyConfigured(f"{name}: {item!r} is not tenant:VARIABLE")
        out.setdefault(tenant.strip(), set()).add(variable.strip())
    return {tenant: tuple(sorted(names)) for tenant, names in out.items()}


# The environment is one namespace shared by every tenant: a tenant's own rows read only these.
TENANT_CREDENTIAL_ENV: dict[str, tuple[str, ...]] = _tenant_env_allowlist("LOOMCYCLE_TENANT_CREDENTIAL_ENV")
# Fire rows and finished on_complete jobs older than this are deleted by the finished sweep.
TRIGGERS_RETENTION_DAYS: int = env.int("LOOMCYCLE_TRIGGERS_RETENTION_DAYS", default=30)
# gRPC (apps/grpcapi, docs/grpc.md): loomcycle.v1.Loomcycle served on this host:port by its own
# process (`manage.py grpc`, which `up` starts); unset, no gRPC. Limits: the largest message
# received (a bigger one is RESOURCE_EXHAUSTED, the stream survives) and sent; keepalive pings
# an idle connection every KEEPALIVE_TIME and drops it when no answer comes within
# KEEPALIVE_TIMEOUT; a client pinging more often than MIN_PING_INTERVAL is sent GOAWAY.
GRPC_ADDR: str | None = env.str("LOOMCYCLE_GRPC_ADDR", default=None) or None
GRPC_MAX_RECV_BYTES: int = _at_least("LOOMCYCLE_GRPC_MAX_RECV_BYTES", 16 * 1024 * 1024, 1024)
GRPC_MAX_SEND_BYTES: int = _at_least("LOOMCYCLE_GRPC_MAX_SEND_BYTES", 64 * 1024 * 1024, 1024)
GRPC_KEEPALIVE_TIME_MS: int = _at_least("LOOMCYCLE_GRPC_KEEPALIVE_TIME_MS", 30_000, 1000)
GRPC_KEEPALIVE_TIMEOUT_MS: int = _at_least("LOOMCYCLE_GRPC_KEEPALIVE_TIMEOUT_MS", 10_000, 1000)
GRPC_MIN_PING_INTERVAL_MS: int = _at_least("LOOMCYCLE_GRPC_MIN_PING_INTERVAL_MS", 10_000, 1000)
# MCP client (docs/mcp.md): how long one tool call or one discovery may take, and how many stdio
# server processes one process keeps (the least recently used is stopped past it).
MCP_CALL_TIMEOUT_SECONDS: float = env.float("LOOMCYCLE_MCP_CALL_TIMEOUT_SECONDS", default=60.0)
MCP_DISCOVERY_TIMEOUT_SECONDS: float = env.float("LOOMCYCLE_MCP_DISCOVERY_TIMEOUT_SECONDS", default=30.0)
MCP_MAX_STDIO_PROCESSES: int = _at_least("LOOMCYCLE_MCP_MAX_STDIO_PROCESSES", 8, 1)
# Bytes read of one MCP HTTP reply (a JSON body, or one event of an SSE stream): a tenant's server is untrusted.
MCP_MAX_RESPONSE_BYTES: int = _at_least("LOOMCYCLE_MCP_MAX_RESPONSE_BYTES", 4 * 1024 * 1024, 1)


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """`settings.LOOMCYCLE`: every knob the apps and workers read at runtime, typed.

    Built once in settings.py from this module's reading; apps and workers read
    `settings.LOOMCYCLE.<field>` where they use it (never this module), so
    `override_settings` and pytest-django's `settings` fixture reach them.
    A field is its environment variable's name, lowercased, without `LOOMCYCLE_`
    (`LOOMCYCLE_MOCK_LATENCY_MS` -> `mock_latency_ms`, `OPENAI_BASE_URL` ->
    `openai_base_url`); docs/configuration.md gives the defaults."""

    listen_addr: str
    auth_token: str | None
    config_files: tuple[str, ...]
    max_request_bytes: int
    max_image_bytes: int
    image_fetch_timeout_ms: int
    sse_keepalive_ms: int
    tool_parallelism: int
    tools_enabled: tuple[str, ...]
    lease_seconds: float
    heartbeat_seconds: float
    sweep_seconds: float
    requeue_grace_seconds: float
    signal_resend_seconds: float
    max_attempts: int
    steer_queue_cap: int
    agent_def_max_definition_bytes: int = 262_144
    agent_def_max_description_bytes: int = 16_384
    skill_def_max_body_bytes: int = 262_144
    operator_token_pepper: str = ""
    operator_token_rotation_grace_seconds: int = 86_400
    audit_log_path: str = ""
    http_host_allowlist: tuple[str, ...] = ()
    http_private_host_allowlist: tuple[str, ...] = ()
    http_caller_authoritative: bool = False
    max_streams_per_principal: int = 64
    mock_enabled: bool = True
    max_stream_seconds: int = 3600
    config_dir: str = ""
    presets: tuple[str, ...] = ()
    config_strict: bool = False
    agents_root: str = ""
    skills_root: str = ""

    # Below: no defaults, so settings.py must set each from this module (one place for a default).
    # Engine admission and timing samples (apps.runs.engine.admission, apps.runs.dispatch).
    engine_admission_slots: int
    engine_admission_tools_after_ms: float
    engine_timings_key: str | None
    # Token lookups (apps.substrate.auth_cache).
    auth_cache_ttl_seconds: float
    auth_epoch_check_ms: int
    # Mock provider (SPEC 7.5).
    mock_latency_ms: float
    mock_latency_jitter_ms: float
    mock_429_rate: float
    mock_500_rate: float
    mock_allow_crash: bool
    fast_transport: bool  # workers/transport.py and hand-built doorbells (LOOMCYCLE_FAST_TRANSPORT)
    # Providers (SPEC C.2): keys by variable name (PROVIDER_KEY_NAMES), endpoints, timeouts, fallback.
    provider_keys: Mapping[str, str | None]
    anthropic_base_url: str
    openai_base_url: str
    deepseek_base_url: str
    gemini_base_url: str
    ollama_base_url: str
    ollama_cloud_base_url: str
    voyage_base_url: str
    provider_connect_timeout_ms: int
    provider_read_timeout_ms: int
    local_provider_read_timeout_ms: int
    fallback_pin_after_success: bool
    # Fairness and admission backpressure (yaml `concurrency:` may override each).
    max_concurrent_runs_per_user: int
    max_concurrent_runs_per_tenant: int
    max_concurrent_children_cap: int
    tenant_max_definitions: int
    tenant_max_schedules: int
    tenant_max_channels: int
    tenant_max_volumes: int
    tenant_schedule_min_period_seconds: int
    operator_key_restriction: bool
    provider_queue_timeout_ms: int
    max_concurrent_runs: int
    max_queue_depth: int
    queue_timeout_ms: int
    # Gateway audit, memory and embedder.
    gateway_audit_retention_days: int
    retention_days: int
    retention_batch: int
    retention_max_batches: int
    retention_sweep_seconds: int
    erasure_batch: int
    embedder: str
    memory_embed_timeout_ms: int
    memory_embed_batch_size: int
    memory_max_value_bytes: int
    memory_max_scope_bytes: int
    memory_sweep_ms: int
    # Channels.
    channels_max_value_bytes: int
    channels_longpoll_cap_ms: int
    channels_sweep_ms: int
    channels_wake_tick_ms: int
    # Interruptions.
    interruption_default_timeout_ms: int
    interruption_max_timeout_ms: int
    interruption_max_pending: int
    interruption_sweep_ms: int
    # Context compaction (apps.gateway.windows).
    context_window_default: int
    # Resident children.
    resident_child_idle_ttl_seconds: int
    resident_max_children: int
    # MCP server.
    mcp_wait_cap_ms: int
    # Evaluations.
    evaluation_max_judgement_bytes: int
    evaluation_max_rationale_bytes: int
    # Redaction (apps.core.redact).
    redact_secrets: bool
    # Tool-use hooks.
    hooks_permit_host_widen: tuple[str, ...] = ()
    hooks_max_per_tenant: int = 32
    hooks_chain_budget_ms: int = 60_000
    # Inbound webhooks (apps.triggers.webhooks).
    webhooks_enabled: bool
    webhooks_allow_unauthenticated: bool
    webhooks_env_allowlist: tuple[str, ...]
    webhooks_delivery_retention_hours: int
    # A2A server and client (apps.a2a).
    a2a_enabled: bool
    a2a_call_inline_seconds: int
    a2a_call_poll_seconds: int
    a2a_call_timeout_seconds: int
    # Completion webhooks (apps.runs.completion).
    run_webhook_secret: str | None
    run_webhook_max_attempts: int
    run_webhook_timeout_ms: int
    # Volumes and the shell (apps.tools).
    volumes_root: str
    bash_enabled: bool
    bash_allowed_creds: str
    bash_bwrap: str = "/usr/bin/bwrap"
    bash_unsandboxed: bool = False
    bash_sandbox_uid: int = 65534
    bash_limit_cpu_seconds: int = 120
    bash_limit_memory_bytes: int = 2 * 1024**3
    bash_limit_processes: int = 128
    bash_limit_file_bytes: int = 256 * 1024**2
    bash_limit_open_files: int = 256
    bash_tenants: tuple[str, ...] = ()
    data_dir: str = ""  # LOOMCYCLE_DATA_DIR (the Bash sandbox hides it)
    # Scheduler (apps.triggers).
    scheduler_enabled: bool
    scheduler_tick_seconds: float
    scheduler_env_allowlist: tuple[str, ...] = ()
    tenant_credential_env: dict[str, tuple[str, ...]]
    triggers_retention_days: int
    # MCP client (apps.mcp.client).
    mcp_call_timeout_seconds: float
    mcp_discovery_timeout_seconds: float
    mcp_max_stdio_processes: int
    mcp_max_response_bytes: int
    # gRPC (apps.grpcapi): LOOMCYCLE_GRPC_ADDR None = not served.
    grpc_addr: str | None = None
    grpc_max_recv_bytes: int = 16 * 1024 * 1024
    grpc_max_send_bytes: int = 64 * 1024 * 1024
    grpc_keepalive_time_ms: int = 30_000
    grpc_keepalive_timeout_ms: int = 10_000
    grpc_min_ping_interval_ms: int = 10_000
    # Observability (apps.core.metrics, loomcycle_project.health).
    metrics_enabled: bool = True
    metrics_tenant_labels: int = 20
    replica_id: str = ""
    # LOOMCYCLE_ALLOWED_HOSTS as the operator set it (empty: unset). Django's ALLOWED_HOSTS is
    # `*` then, and test runners add names to it; a public name here ends open mode.
    allowed_hosts: tuple[str, ...] = ()
    beat_heartbeat_file: str = ""  # workers.heartbeat; settings.py always sets it
    # Tracing (loomcycle_project.telemetry): the exporters this process installs, from OTEL_* (env.py).
    tracing_exporters: tuple[str, ...] = ()
    # Snapshots (apps.snapshots).
    snapshot_max_bytes: int = 536_870_912
    # The code version this process's iterations record (apps.runs.store.hot; docs/operations.md).
    worker_version: str = ""
