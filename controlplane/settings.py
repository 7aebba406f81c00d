"""Spillway settings: everything comes from the environment (see controlplane/env.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane import localenv
from controlplane.env import envbool, envint, envlist, envsecret, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("SPILLWAY_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Under pytest the dev-only secrets are allowed, so a bare `pytest` works.
TESTING = envbool("SPILLWAY_TESTING", "pytest" in sys.modules)
if not TESTING:
    localenv.load(VAR_DIR)  # var/local.env from `make run` (the environment wins over it)
DEBUG = envbool("DEBUG", False)

SECRET_KEY = envsecret("SECRET_KEY")
if not SECRET_KEY:
    if DEBUG or TESTING:
        SECRET_KEY = "insecure-dev-only-secret-key-do-not-use-in-production"  # noqa: S105
    else:
        raise ImproperlyConfigured("SECRET_KEY is required outside DEBUG (or SECRET_KEY_FILE)")

if TESTING:
    # The suite only: PBKDF2 costs ~0.3 s per set_password on these machines and fixtures make ~700 users (about
    # 1.8 min of a run). Processes the suite starts (workers, servers) get SPILLWAY_TESTING and agree on it.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Key for credentials encrypted at rest (node SSH keys, TLS private keys). Separate
# from SECRET_KEY so rotating sessions does not make stored secrets unreadable.
FIELD_ENCRYPTION_KEY = envsecret("FIELD_ENCRYPTION_KEY")
if not FIELD_ENCRYPTION_KEY:
    if DEBUG or TESTING:
        FIELD_ENCRYPTION_KEY = "dev-only-field-key"
    else:
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEY is required outside DEBUG")

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets served from our origin (no CDN; the CSP allows only 'self')
    "django_htmx",
    "django_celery_beat",
    "apps.core",
    "apps.accounts",
    "apps.audit",
    "apps.balancers",
    "apps.fleets",
    "apps.traffic",
    "apps.capacity",
    "apps.scheduling",
    "apps.cloud",
    "apps.events",
    "apps.acme",
    "apps.configcode",
    "apps.signals",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "apps.core.middleware.StaticFilesMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "apps.accounts.sso.SsoSessionMiddleware",
    "apps.accounts.middleware.PrincipalMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "apps.core.middleware.RequestIdMiddleware",
    "apps.core.middleware.RefuseNulMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.accounts.context_processors.principal",
            ],
        },
    }
]

DATABASE_URL = envstr("DATABASE_URL", f"sqlite:///{VAR_DIR / 'spillway.sqlite3'}")
# Health checks: a kept connection that PostgreSQL dropped (restarted, failed over) is replaced at the start of
# the next request instead of failing it (tests/core/test_database_down.py).
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", 60),
                                                conn_health_checks=True)}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from exc
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "apps.core.dbbackend"  # the health check without a round trip when idle
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite is the zero-setup default; WAL and a busy timeout let web, worker and
    # beat share the file without "database is locked" errors.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"]["TEST"] = {"NAME": envstr("TEST_DATABASE_NAME", "") or None}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- security -----------------------------------------------------------------
SECURE_COOKIES = envbool("SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = envint("SESSION_COOKIE_AGE", 12 * 3600, minimum=300)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
        "base-uri": ["'self'"],
    }
}
# Web server (controlplane/asgi.py under `gunicorn -k asgi`): request threads per process.
WEB_THREADS = envint("WEB_THREADS", 4, minimum=1)
# Long-polls (GET .../applied/?timeout=) served by controlplane.asgi park in a coroutine, holding no thread:
# at most LONGPOLL_WAITS_PER_PRINCIPAL wait at once per principal (across processes) and
# LONGPOLL_PARKED_PER_PROCESS per web process; beyond that they answer the current state at once
# (202 + Retry-After). A parked one re-checks on each Redis wake-up (and when the subscription is re-made),
# and every LONGPOLL_RECHECK_S: with Redis only a fallback for a lost message (then the wait ends at the
# client's timeout, <= 60 s, with the state), without Redis the only way to notice.
LONGPOLL_WAITS_PER_PRINCIPAL = envint("LONGPOLL_WAITS_PER_PRINCIPAL", 256, minimum=0)
LONGPOLL_PARKED_PER_PROCESS = envint("LONGPOLL_PARKED_PER_PROCESS", 2000, minimum=0)
LONGPOLL_RECHECK_S = envint("LONGPOLL_RECHECK_S", 60 if envstr("REDIS_URL") else 2, minimum=1)
# Under a plain WSGI server (the suite's live_server, `manage.py runserver`) a long-poll blocks a thread:
# at most this many per process and per principal across processes; the rest answer at once.
LONGPOLL_SLOTS_PER_PROCESS = envint("LONGPOLL_SLOTS_PER_PROCESS", 2, minimum=0)
LONGPOLL_SLOTS_PER_PRINCIPAL = envint("LONGPOLL_SLOTS_PER_PRINCIPAL", 2, minimum=0)
# The suite logs in from loopback hundreds of times across parallel workers and live servers; the throttle's own
# tests set the limit they exercise (5) explicitly.
NO_ORG_URL = "/invitations/"  # where a signed-in person in no organization lands (their invitations)
LOGIN_THROTTLE_ATTEMPTS = envint("LOGIN_THROTTLE_ATTEMPTS", 1000 if TESTING else 5, minimum=1)
LOGIN_THROTTLE_WINDOW_S = envint("LOGIN_THROTTLE_WINDOW_S", 300, minimum=1)

# --- single sign-on (OpenID Connect, apps/accounts/sso.py; mozilla-django-oidc does the code flow) -------
# SSO is on when SSO_ISSUER is set: endpoints come from the issuer's discovery document unless given.
SSO_ISSUER = envstr("SSO_ISSUER", "").rstrip("/")
SSO_CLIENT_ID = envstr("SSO_CLIENT_ID", "")
SSO_CLIENT_SECRET = envsecret("SSO_CLIENT_SECRET")
# Endpoints, for an IdP without discovery (each one given here wins over the discovery document's).
SSO_AUTHORIZATION_ENDPOINT = envstr("SSO_AUTHORIZATION_ENDPOINT", "")
SSO_TOKEN_ENDPOINT = envstr("SSO_TOKEN_ENDPOINT", "")
SSO_USERINFO_ENDPOINT = envstr("SSO_USERINFO_ENDPOINT", "")
SSO_JWKS_URI = envstr("SSO_JWKS_URI", "")
SSO_SCOPES = envstr("SSO_SCOPES", "openid email profile groups")
SSO_BUTTON_LABEL = envstr("SSO_BUTTON_LABEL", "Sign in with single sign-on")
# The claim that names the just-in-time user (falls back to email, then sub).
SSO_USERNAME_CLAIM = envstr("SSO_USERNAME_CLAIM", "preferred_username")
# Claim -> org and role: a JSON list of {"claim": "groups", "value": "acme-admins", "org": "acme", "role": "admin"}
# (a list-valued claim matches when it contains the value). Memberships in the orgs named here follow the IdP at
# every sign-in; an account whose claims map to no org is refused.
SSO_ORG_MAP = envstr("SSO_ORG_MAP", "[]")
# The session ends when the id_token expires (its `exp`), capped at SSO_SESSION_MAX_S; then the next page load
# asks the IdP again without a prompt (prompt=none): still signed in there → a new token, signed out → logged out.
SSO_SESSION_MAX_S = envint("SSO_SESSION_MAX_S", 3600, minimum=1)
SSO_TIMEOUT_S = envint("SSO_TIMEOUT_S", 10, minimum=1)
# Off: the login page offers only SSO and no password is checked anywhere (the admin included).
LOCAL_LOGIN_ENABLED = envbool("LOCAL_LOGIN_ENABLED", True)
if not LOCAL_LOGIN_ENABLED and not SSO_ISSUER:
    raise ImproperlyConfigured("LOCAL_LOGIN_ENABLED=0 needs SSO_ISSUER (nobody could log in)")
AUTHENTICATION_BACKENDS = ["apps.accounts.sso.LocalBackend", "apps.accounts.sso.SsoBackend"]
OIDC_AUTHENTICATION_CALLBACK_URL = "sso-callback"

# --- cache (login throttling, idempotency keys, hot health copy) ----------------
REDIS_URL = envstr("REDIS_URL")
# pytest-xdist workers share one Redis: each takes its own database index (base + worker + 1), so one
# worker's broker purge or cache clear never touches another's. Children of a worker inherit the variable.
_XDIST_WORKER = envstr("PYTEST_XDIST_WORKER")
if TESTING and REDIS_URL and _XDIST_WORKER.startswith("gw"):
    _base, _, _db = REDIS_URL.rpartition("/")
    REDIS_URL = f"{_base}/{(int(_db or 0) + int(_XDIST_WORKER[2:]) + 1) % 16}"
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "spillway_cache",
        }
    }

# --- REST framework -------------------------------------------------------------
# Request bodies: every API view reads at most API_MAX_BODY_BYTES (a view may allow more, e.g. a config
# document), answering 413 past it (apps/core/api/parsers.py). Django's own ceiling sits above the largest.
API_MAX_BODY_BYTES = envint("API_MAX_BODY_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 8 * 1024 * 1024) + 1024
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.BearerTokenAuthentication",
        "apps.accounts.authentication.SessionAuthentication401",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.OrgRolePermission"],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "apps.core.api.filters.ScopedFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "apps.core.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "apps.core.api.errors.exception_handler",
    # preview runs `haproxy -c`; longpoll may hold a web thread (apps/core/api/throttles.py).
    "DEFAULT_THROTTLE_RATES": {"login": "10/min", "preview": envstr("THROTTLE_PREVIEW", "20/min"),
                               "longpoll": envstr("THROTTLE_LONGPOLL", "600/min")},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # JSON only: form encodings cannot carry the bodies (lists of targets, nested objects). The
    # parser refuses NUL characters and deep nesting at the edge (apps/core/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["apps.core.api.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Spillway API",
    "DESCRIPTION": "Control plane for HAProxy fleets and cloud load balancers.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Descriptions for integrators: no developer note inherited from a base class, none left empty.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "apps.core.api.schema.describe_hook"],
}

# --- Celery ---------------------------------------------------------------------
# Broker: Redis when REDIS_URL is set; otherwise kombu's SQLAlchemy transport on a
# SQLite file so `make run` needs no server.
CELERY_BROKER_URL = REDIS_URL or f"sqla+sqlite:///{VAR_DIR / 'broker.sqlite3'}"
CELERY_RESULT_BACKEND = None
# Event webhook deliveries have their own queue, so they never wait behind a rollout or a capacity run, and
# their own worker (`celery worker -Q events --pool threads`, started by runall): a delivery mostly waits on
# the network and the database, so threads give concurrency cheaply (tests/bench/bench_events.py).
#
# ACME issuance and deployment (apps.acme.tasks) have their own queue and a one-slot worker (`celery worker
# -Q acme --concurrency 1`, started by runall): a certificate asked for does not wait behind fleet render/push
# work, nor does that work wait behind a batch of orders. One slot: a task orders every due certificate
# together, and a second slot on a 2-core host was measured slower (CPU contention with the rollouts),
# tests/bench/bench_acme.py.
#
# Fleet reconciles (render, then roll out) go to one of FLEET_WORKER_SHARDS queues by fleet id (`fleets.0`,
# `fleets.1`, ...: apps.fleets.rollout.queues), each served by ONE worker process (runall): the route lane
# (apps.fleets.config.routelane) keeps each fleet's last render in the process that made it. On one prefork pool a
# fleet's reconciles landed on either process, and each landing on the other one rendered all 100k routes
# again (17-21 s under load in bench-scale, instead of ~60 ms); all fleets in one process shared its
# interpreter lock (two fleets' lane steps 100-120 ms instead of 50-60 ms).
FLEET_WORKER_SHARDS = envint("FLEET_WORKER_SHARDS", 2, minimum=1)
FLEET_QUEUES = [f"fleets.{shard}" for shard in range(FLEET_WORKER_SHARDS)]
# A fleet worker covers another shard's queue when every worker of that shard is gone, once it has itself run
# this long (apps.fleets.rollout.shards.COVER_AFTER_START_S).
FLEET_SHARD_COVER_AFTER_S = envint("FLEET_SHARD_COVER_AFTER_S", 15, minimum=0)
# The periodic drift check reads each node's live maps at most this often (apps.fleets.rollout.drift.LIVE_MAPS_EVERY_S).
FLEET_LIVE_MAPS_EVERY_S = envint("FLEET_LIVE_MAPS_EVERY_S", 30, minimum=1)
# How long the periodic drift check may put off a fleet whose rollouts move its nodes under every look
# (apps.fleets.rollout.drift.MAX_DEFER_S); then it holds the fleet's lease while it reads.
FLEET_DRIFT_MAX_DEFER_S = envint("FLEET_DRIFT_MAX_DEFER_S", 300, minimum=0)
CELERY_TASK_ROUTES = (
    "apps.fleets.rollout.queues.route_task",
    {"events.*": {"queue": "events"}, "acme.*": {"queue": "acme"}},
)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TIMEZONE = "UTC"
# A task is acknowledged after it finishes, so a worker killed mid-task leaves the
# message to be redelivered; tasks are idempotent, so running one again converges.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One message at a time per process: long rollouts must not hold short ones hostage.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery closes every database connection before and after each task unless told to reuse them: each fleet
# reconcile then opened a new PostgreSQL connection (its first query took ~14 ms a task under load in
# bench-scale's sustained run, py-spy). Reused for this many tasks, within CONN_MAX_AGE (Django's own rule).
CELERY_DB_REUSE_MAX = envint("CELERY_DB_REUSE_MAX", 200, minimum=0)
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
# django-celery-beat's database scheduler, sending only while it holds the beat lease: run a second beat as its
# standby (controlplane/beat.py).
CELERY_BEAT_SCHEDULER = "controlplane.beat:LeaderScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Sending a task while the broker is down gives up after ~1 s (apps.core.enqueue then leaves the work to its
# periodic safety net): kombu's default retries kept an API write waiting ~20 s per task it queued.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.4}
if REDIS_URL:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 10}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {"format": "%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s %(message)s"},
    },
    "filters": {"request_id": {"()": "apps.core.middleware.RequestIdLogFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "structured", "filters": ["request_id"]},
    },
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    # asyncssh logs every channel at INFO: each runtime API command to an SSH node is one, and the enforcer sends
    # several a second per node (37k lines from one enforcer in a 6-minute bench-chaos run). Its failures reach
    # Spillway's own logs and pages as TransportError.
    "loggers": {"asyncssh": {"level": envstr("ASYNCSSH_LOG_LEVEL", "WARNING")}},
}

# --- Spillway -------------------------------------------------------------------
HAPROXY_BIN = envstr("HAPROXY_BIN", "haproxy")
# Golden signals (apps.signals): where nodes send their request log unless their fleet says otherwise
# (`address:port` as the nodes reach the collector; blank: no request log), and where the collector
# (`manage.py runsignals`) listens.
SIGNALS_TARGET = envstr("SPILLWAY_SIGNALS_TARGET", "")
SIGNALS_LISTEN = envstr("SPILLWAY_SIGNALS_LISTEN", "127.0.0.1:5514")
# Private/loopback networks every org's pool members may use (an operator's decision; per-org additions
# are Organization.member_networks). The demo and the suite run members on loopback.
# Who may scrape /metrics without a token (an operator token with the read scope always may). Empty by
# default in production: behind a reverse proxy every request would seem to come from loopback.
METRICS_ALLOWED_NETWORKS = envlist("METRICS_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"] if DEBUG or TESTING else [])
# Ports customers' listeners may bind on the fleets (operators may bind any): not the nodes' sshd & co.
TENANT_LISTENER_PORTS = envstr("SPILLWAY_TENANT_LISTENER_PORTS", "80,443,1024-65535")
MEMBER_NETWORKS = envlist("SPILLWAY_MEMBER_NETWORKS", ["127.0.0.0/8"] if DEBUG or TESTING else [])
TERRAFORM_BIN = envstr("TERRAFORM_BIN", "")
IDEMPOTENCY_TTL_S = envint("IDEMPOTENCY_TTL_S", 24 * 3600, minimum=60)
# Networks a tenant's job may reach besides public addresses (webhooks, http_check), e.g. "10.20.0.0/16".
SCHEDULING_TENANT_URL_ALLOW_CIDRS = envlist("SCHEDULING_TENANT_URL_ALLOW_CIDRS", [])

# Event deliveries (apps.events): attempts per delivery, first retry delay (then 4 times longer each time), timeout.
EVENTS_MAX_ATTEMPTS = envint("EVENTS_MAX_ATTEMPTS", 6, minimum=1)
EVENTS_RETRY_BASE_S = float(envstr("EVENTS_RETRY_BASE_S", "10"))
EVENTS_TIMEOUT_S = float(envstr("EVENTS_TIMEOUT_S", "5"))  # the whole attempt (apps.core.outbound)
# Deliveries of one org sending at once: one org's slow receivers hold at most this many worker threads.
EVENTS_ORG_CONCURRENCY = envint("EVENTS_ORG_CONCURRENCY", 2, minimum=1)
OUTBOUND_DEFAULT_DEADLINE_S = float(envstr("OUTBOUND_DEFAULT_DEADLINE_S", "30"))
# ACME (apps.acme): the CA's directory (e.g. https://acme-v02.api.letsencrypt.org/directory; empty = off), a CA
# bundle to trust it by (tests: pebble's), and the RFC 2136 server dns-01 updates go to (TSIG-signed).
ACME_DIRECTORY_URL = envstr("ACME_DIRECTORY_URL", "")
ACME_CA_BUNDLE = envstr("ACME_CA_BUNDLE", "")
ACME_CONTACT_EMAIL = envstr("ACME_CONTACT_EMAIL", "")
ACME_DNS_PROVIDER = {
    "kind": "rfc2136", "server": envstr("ACME_DNS_RFC2136_SERVER", ""), "port": envint("ACME_DNS_RFC2136_PORT", 53),
    "key_name": envstr("ACME_DNS_RFC2136_KEY_NAME", "spillway"),
    "key_secret": envsecret("ACME_DNS_RFC2136_KEY_SECRET", ""),
    "algorithm": envstr("ACME_DNS_RFC2136_KEY_ALGORITHM", "hmac-sha256"),
} if envstr("ACME_DNS_RFC2136_SERVER", "") else {}
