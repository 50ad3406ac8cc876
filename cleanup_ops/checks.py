"""System checks of the console's and the pipeline's settings, and of what a host project lacks.

Errors (``cleanup_ops.E…``): a setting whose value breaks its rule
(``cleanup_ops.defaults``), or two settings that contradict each other, named.
Warnings (``cleanup_ops.W…``): something the console, the API or the workers
rely on that the project has not set up — an app, a middleware, an
authentication backend, the guarded admin site, the login page, django-q2's
cluster — each with the line to add. The demo project (``config/``) passes
them all; ``tests/test_installable.py`` runs them in a fresh host project.
They run at start-up (``runserver``, ``migrate``, ``qcluster``, ``manage.py check``).

``CONSOLE_REFRESH_SECONDS``: how often a live page re-fetches its figures.
Its default lives here, in the app (``DEFAULT_REFRESH_SECONDS``), so a host
project that never names it gets 5 s; ``config/settings.py`` reads it from
the environment when set. A value that is not a whole number from
``MIN_REFRESH_SECONDS`` to ``MAX_REFRESH_SECONDS`` is an error naming the
setting: a page refreshed every 0 s would hammer the database, one every
hour is not live.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks

from cleanup_ops.defaults import SETTINGS
from cleanup_ops.downstream.urls import docstore_url_check
from cleanup_ops.execution.leases import TOKEN_SLEEP_STRETCH
from cleanup_ops.proof_keys import signing_settings_problems
from retention.conf import setting_errors

DEFAULT_REFRESH_SECONDS = 5
MIN_REFRESH_SECONDS = 1
MAX_REFRESH_SECONDS = 600


def refresh_problem(value: Any) -> str | None:
    """Why ``value`` is no refresh interval, or None."""
    if isinstance(value, bool):
        return f"must be a whole number of seconds, got {value!r}"
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            return f"must be a whole number of seconds, got {value!r}"
        value = int(text)
    if not isinstance(value, int):
        return f"must be a whole number of seconds, got {value!r}"
    if not MIN_REFRESH_SECONDS <= value <= MAX_REFRESH_SECONDS:
        return f"must be from {MIN_REFRESH_SECONDS} to {MAX_REFRESH_SECONDS} seconds, got {value}"
    return None


def refresh_seconds() -> int:
    """The interval in force: the setting when valid, else the default (the
    system check has reported the bad value)."""
    value = getattr(settings, "CONSOLE_REFRESH_SECONDS", DEFAULT_REFRESH_SECONDS)
    if refresh_problem(value) is not None:
        return DEFAULT_REFRESH_SECONDS
    return int(str(value).strip())


@checks.register()
def check_console_refresh(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    value = getattr(settings, "CONSOLE_REFRESH_SECONDS", DEFAULT_REFRESH_SECONDS)
    problem = refresh_problem(value)
    if problem is None:
        return []
    return [
        checks.Error(
            f"CONSOLE_REFRESH_SECONDS {problem}.",
            hint=f"Set CONSOLE_REFRESH_SECONDS to a whole number from {MIN_REFRESH_SECONDS} to "
            f"{MAX_REFRESH_SECONDS} (default {DEFAULT_REFRESH_SECONDS}), or leave it unset.",
            id="cleanup_ops.E101",
        )
    ]


GUARDED_ADMIN = "retention.admin_site.GuardedAdminConfig"

# (INSTALLED_APPS entry, why the product needs it)
REQUIRED_APPS = (
    ("django.contrib.auth", "users, groups and permissions"),
    ("django.contrib.contenttypes", "permissions"),
    ("django.contrib.sessions", "the console's login"),
    ("django.contrib.messages", "the console's and the admin's notices"),
    ("django.contrib.staticfiles", "the console's script and styles"),
    ("rest_framework", "the REST API"),
    ("knox", "the API's tokens, hashed at rest with an expiry (the scheduler's trigger; django-rest-knox)"),
    ("drf_spectacular", "the API's OpenAPI schema"),
    ("drf_spectacular_sidecar", "Swagger UI and Redoc served offline"),
    ("django_htmx", "the console's live refresh"),
    ("django_q", "the workers (django-q2)"),
    ("axes", "login throttling (django-axes)"),
)
REQUIRED_MIDDLEWARE = (
    ("retention.apierrors.ApiJsonErrors", "JSON error answers under api/ (a 500, the CSRF check's 403, a 414)"),
    ("csp.middleware.CSPMiddleware", "the Content-Security-Policy on every answer (django-csp)"),
    ("retention.middleware.RefuseControlCharacters", "a 400 naming a parameter that holds a NUL"),
    ("django.contrib.sessions.middleware.SessionMiddleware", "the console's login"),
    ("django.middleware.csrf.CsrfViewMiddleware", "the console's forms"),
    ("django.contrib.auth.middleware.AuthenticationMiddleware", "the console's login"),
    ("django.contrib.messages.middleware.MessageMiddleware", "the console's notices"),
    (
        "cleanup_ops.middleware.SessionIdleTimeout",
        "idle logins end after CONSOLE_SESSION_IDLE_SECONDS (after AuthenticationMiddleware)",
    ),
    ("axes.middleware.AxesMiddleware", "the answer to a locked-out login (last in MIDDLEWARE)"),
)
REQUIRED_BACKENDS = (
    ("axes.backends.AxesStandaloneBackend", "refuses a locked-out username (first in the list)"),
    ("django.contrib.auth.backends.ModelBackend", "logs users in"),
    ("retention.backends.MembershipBackend", "the permissions of a user's portfolio memberships"),
)
# REST_FRAMEWORK entries the API relies on: (key, value it must hold, why).
REQUIRED_REST_FRAMEWORK = (
    (
        "DEFAULT_AUTHENTICATION_CLASSES",
        "knox.auth.TokenAuthentication",
        "the scheduler's trigger and scripts authenticate with a token (knox's, hashed at rest)",
    ),
    (
        "DEFAULT_AUTHENTICATION_CLASSES",
        "rest_framework.authentication.SessionAuthentication",
        "the console's users reach the API with their session",
    ),
    (
        "DEFAULT_PERMISSION_CLASSES",
        "rest_framework.permissions.IsAuthenticated",
        "the API root and schema answer only logged-in users",
    ),
    (
        "DEFAULT_PAGINATION_CLASS",
        "rest_framework.pagination.PageNumberPagination",
        "the lists are paginated, as the schema says",
    ),
    ("DEFAULT_SCHEMA_CLASS", "drf_spectacular.openapi.AutoSchema", "the OpenAPI schema at api/v1/schema/"),
    ("EXCEPTION_HANDLER", "retention.apierrors.api_exception_handler", "every error body is a JSON object"),
)
# django-q2 options the pipeline's correctness relies on (docs/architecture.md, "Working with django-q2").
Q_CLUSTER_OPTIONS = {"ack_failures": True, "max_attempts": 1, "bulk": 1}


PROOF_KEY_HINT = "docs/operating.md, 'Proof signing keys': make one with manage.py cleanup_proof_key --generate"
PROOF_KEY_MISSING = (
    "RETENTION_PROOF_SIGNING_KEY: not set and DEBUG is off: every proof export answers 503 until a key is set"
)


@checks.register(deploy=True)
def proof_key_deploy_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A deployment without a signing key cannot give an auditor a proof: an error for ``check --deploy``."""
    if settings.RETENTION_PROOF_SIGNING_KEY or settings.DEBUG:
        return []
    return [checks.Error(PROOF_KEY_MISSING, hint=PROOF_KEY_HINT, id="cleanup_ops.E121")]


@checks.register()
def pipeline_settings_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors = setting_errors(SETTINGS, id_prefix="cleanup_ops.settings")
    if errors:
        return errors
    if settings.DOCSTORE_URL:
        try:
            docstore_url_check(
                settings.DOCSTORE_URL, schemes=settings.DOCSTORE_ALLOWED_SCHEMES, hosts=settings.DOCSTORE_ALLOWED_HOSTS
            )
        except ValueError as exc:
            errors.append(checks.Error(str(exc), id="cleanup_ops.E111"))
    if settings.DOCSTORE_CONNECT_TIMEOUT + settings.DOCSTORE_READ_TIMEOUT >= settings.CLEANUP_LEASE_SECONDS:
        # One request must fit in a lease, or every slow answer would end in a lost lease.
        errors.append(
            checks.Error(
                "DOCSTORE_READ_TIMEOUT: connect + read timeout must stay under "
                f"CLEANUP_LEASE_SECONDS ({settings.CLEANUP_LEASE_SECONDS})",
                id="cleanup_ops.E112",
            )
        )
    if _storage_kinds_configured() and (
        settings.STORAGE_PURGE_CONNECT_TIMEOUT + 2 * settings.STORAGE_PURGE_READ_TIMEOUT
        >= settings.CLEANUP_LEASE_SECONDS
    ):
        # As for the HTTP store: one storage call (a DeleteObjects) must fit in a lease.
        errors.append(
            checks.Error(
                "STORAGE_PURGE_READ_TIMEOUT: connect + twice the read timeout must stay under "
                f"CLEANUP_LEASE_SECONDS ({settings.CLEANUP_LEASE_SECONDS})",
                id="cleanup_ops.E115",
            )
        )
    # Proofs are signed: a bad key, or none with DEBUG off, is a start-up error rather than
    # an export that fails later (or, worse, one signed with the public demo key).
    for name, problem in signing_settings_problems():
        errors.append(
            checks.Error(
                f"{name}: {problem}",
                hint=PROOF_KEY_HINT,
                id="cleanup_ops.E120",
            )
        )
    if not settings.RETENTION_PROOF_SIGNING_KEY and not settings.DEBUG:
        errors.append(checks.Warning(PROOF_KEY_MISSING, hint=PROOF_KEY_HINT, id="cleanup_ops.W120"))
    if settings.CONSOLE_SESSION_IDLE_SECONDS > settings.SESSION_COOKIE_AGE:
        # The absolute bound would end every session before it could be idle that long.
        errors.append(
            checks.Error(
                f"CONSOLE_SESSION_IDLE_SECONDS: must not exceed SESSION_COOKIE_AGE ({settings.SESSION_COOKIE_AGE}), "
                f"got {settings.CONSOLE_SESSION_IDLE_SECONDS}",
                id="cleanup_ops.E116",
            )
        )
    floor = TOKEN_SLEEP_STRETCH * settings.CLEANUP_SLICE_SECONDS + settings.CLEANUP_HEARTBEAT_SECONDS
    if settings.CLEANUP_LIVENESS_STALE_SECONDS <= floor:
        # A busy, healthy cluster reports progress at least once per turn plus
        # the heartbeat interval, and a turn asleep for rate tokens lasts up to
        # TOKEN_SLEEP_STRETCH slices; anything shorter would restart healthy clusters.
        errors.append(
            checks.Error(
                f"CLEANUP_LIVENESS_STALE_SECONDS: must exceed {TOKEN_SLEEP_STRETCH} * CLEANUP_SLICE_SECONDS + "
                f"CLEANUP_HEARTBEAT_SECONDS ({floor:g}), got {settings.CLEANUP_LIVENESS_STALE_SECONDS}",
                id="cleanup_ops.E113",
            )
        )
    return errors


def _missing(name: str, entries: list[str], required: tuple[tuple[str, str], ...], number: int) -> list[Any]:
    return [
        checks.Warning(
            f"{name}: {entry!r} is missing; the console needs it for {why}.",
            hint=f"Add {entry!r} to {name}.",
            id=f"cleanup_ops.W{number:03d}",
        )
        for entry, why in required
        if entry not in entries
    ]


@checks.register()
def host_project_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    warnings: list[checks.CheckMessage] = []
    installed = [config.name for config in apps.get_app_configs()]
    warnings += _missing("INSTALLED_APPS", installed, REQUIRED_APPS, 1)
    if apps.is_installed("django.contrib.admin"):
        admin_config = apps.get_app_config("admin")
        if f"{type(admin_config).__module__}.{type(admin_config).__qualname__}" != GUARDED_ADMIN:
            warnings.append(
                checks.Warning(
                    "INSTALLED_APPS: the admin is Django's own site; the product's guarded site checks every "
                    "changelist and autocomplete request of a customer's staff before Django's code runs.",
                    hint=f"Replace 'django.contrib.admin' with {GUARDED_ADMIN!r} in INSTALLED_APPS.",
                    id="cleanup_ops.W002",
                )
            )
    else:
        warnings.append(
            checks.Warning(
                "INSTALLED_APPS: no admin; policies, versions and legal holds are edited in it.",
                hint=f"Add {GUARDED_ADMIN!r} to INSTALLED_APPS and path('admin/', admin.site.urls) to the URLs.",
                id="cleanup_ops.W002",
            )
        )
    warnings += _missing("MIDDLEWARE", list(settings.MIDDLEWARE), REQUIRED_MIDDLEWARE, 3)
    warnings += _missing("AUTHENTICATION_BACKENDS", list(settings.AUTHENTICATION_BACKENDS), REQUIRED_BACKENDS, 4)
    warnings += _template_warnings()
    warnings += _rest_framework_warnings()
    warnings += _q_cluster_messages()
    warnings += _login_url_warnings()
    return warnings


def _template_warnings() -> list[checks.CheckMessage]:
    # A host's TEMPLATES entries: dicts of Django's documented keys (their values of several types).
    templates: list[dict[str, Any]] = list(settings.TEMPLATES)
    django_templates = [t for t in templates if t.get("BACKEND", "").endswith("DjangoTemplates")]
    processors = {p for t in django_templates for p in t.get("OPTIONS", {}).get("context_processors", [])}
    warnings: list[checks.CheckMessage] = []
    if not any(t.get("APP_DIRS") for t in django_templates):
        warnings.append(
            checks.Warning(
                "TEMPLATES: the console's templates ship in the apps' templates/ directories.",
                hint="Set 'APP_DIRS': True in the DjangoTemplates entry of TEMPLATES.",
                id="cleanup_ops.W005",
            )
        )
    for processor in (
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ):
        if processor not in processors:
            warnings.append(
                checks.Warning(
                    f"TEMPLATES: the context processor {processor!r} is missing; the console's pages use it.",
                    hint=f"Add {processor!r} to TEMPLATES[0]['OPTIONS']['context_processors'].",
                    id="cleanup_ops.W006",
                )
            )
    return warnings


def _rest_framework_warnings() -> list[checks.CheckMessage]:
    configured = (settings.REST_FRAMEWORK if hasattr(settings, "REST_FRAMEWORK") else None) or {}
    warnings: list[checks.CheckMessage] = []
    for key, value, why in REQUIRED_REST_FRAMEWORK:
        held = configured.get(key)
        if held == value or (isinstance(held, list | tuple) and value in held):
            continue
        line = (
            f"REST_FRAMEWORK[{key!r}] = [{value!r}, …]"
            if key.endswith("CLASSES")
            else f"REST_FRAMEWORK[{key!r}] = {value!r}"
        )
        warnings.append(
            checks.Warning(
                f"REST_FRAMEWORK: {key} does not name {value!r}; {why}.",
                hint=f"Set {line}.",
                id="cleanup_ops.W009",
            )
        )
    return warnings


def _q_cluster_messages() -> list[checks.CheckMessage]:
    cluster = settings.Q_CLUSTER if hasattr(settings, "Q_CLUSTER") else None
    if not isinstance(cluster, dict) or "name" not in cluster or "workers" not in cluster:
        return [
            checks.Error(
                "Q_CLUSTER: django-q2's configuration must name the queue and the workers.",
                hint="Q_CLUSTER = {'name': 'retention', 'workers': 2, 'queue_limit': 2, 'bulk': 1, 'timeout': 120, "
                "'retry': 480, 'max_attempts': 1, 'ack_failures': True, 'orm': 'default', "
                "'broker_class': 'cleanup_ops.brokers.DelayableORM'}",
                id="cleanup_ops.E114",
            )
        ]
    return [
        checks.Warning(
            f"Q_CLUSTER: {option!r} is {cluster.get(option)!r}; the pipeline expects {expected!r} "
            "(a task records its own outcome; the broker must never re-run it).",
            hint=f"Set Q_CLUSTER[{option!r}] = {expected!r}.",
            id="cleanup_ops.W007",
        )
        for option, expected in Q_CLUSTER_OPTIONS.items()
        if cluster.get(option) != expected
    ]


def _login_url_warnings() -> list[checks.CheckMessage]:
    from django.shortcuts import resolve_url
    from django.urls import NoReverseMatch, Resolver404, resolve

    try:
        resolve(resolve_url(settings.LOGIN_URL).split("?", 1)[0])
    except (Resolver404, NoReverseMatch):
        return [
            checks.Warning(
                f"LOGIN_URL: {settings.LOGIN_URL!r} is not a page of this project; the console sends "
                "visitors who are not logged in there.",
                hint="Set LOGIN_URL = 'login' (the product's login page, in cleanup_ops.urls), or your own login page.",
                id="cleanup_ops.W008",
            )
        ]
    return []


def _storage_kinds_configured() -> bool:
    """Whether any record kind keeps its attachments in a Django storage (the
    storage timeouts matter only then; the HTTP store has its own check)."""
    from retention.registry import REGISTRY

    # The registry's reading of each kind (``RecordKindSpec.attachment_storage``),
    # not the raw setting again: one home for "which kinds use a Django storage".
    return any(spec.attachment_storage for spec in REGISTRY.values())


@checks.register(checks.Tags.database)
def check_document_spellings(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """cleanup_ops.W010: rows of a storage kind that spell their key other
    than the storage's name (``contracts//a.pdf`` for ``contracts/a.pdf``)
    with the spelling not recorded (``DocumentSpelling``: written before the
    reference guard, or on a table without it). The purge's living-reference
    check would not see such a row name its file. cleanup_ops.W011: a storage
    kind's trigger is missing or installed with other name rules (another
    location, or before issue 37). Runs with the database checks (``check
    --database default``, ``migrate``); one scan per storage kind's table."""
    if not databases or not _storage_kinds_configured():
        return []
    from cleanup_ops.downstream.guard import guards_outdated, spellings_missing

    outdated: list[checks.CheckMessage] = [
        checks.Warning(
            f"RETENTION_RECORD_KINDS[{kind!r}]: its table's reference guard is missing or does not apply its "
            "storage's current name rules; a record naming a file another way takes another decision row",
            hint="run manage.py cleanup_reference_guard --install (or the SQL of --print-sql, by the table's owner)",
            id="cleanup_ops.W011",
        )
        for kind in guards_outdated()
    ]
    return outdated + [
        checks.Warning(
            f"RETENTION_RECORD_KINDS[{kind!r}]: {count} key spelling{'' if count == 1 else 's'} in its rows"
            f" {'names' if count == 1 else 'name'} a file of the storage another way"
            f" and {'is' if count == 1 else 'are'} not recorded; the purge could delete a file such a row still names",
            hint="run manage.py cleanup_reference_guard --install (it guards the table and records them)",
            id="cleanup_ops.W010",
        )
        for kind, count in spellings_missing().items()
    ]
