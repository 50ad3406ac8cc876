from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from importlib import import_module
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import override_settings

from retention.models import PolicyVersion, RetentionPolicy
from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

# The user, customer, site and lease models the settings name: the demo's (the
# annotations'), or the UUID schema's when the suite runs on it (tests/settings_uuid.py),
# where the demo's are not installed. Test modules that run on both take them from here.
if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from properties.models import Lease, Portfolio, Property
else:
    from django.contrib.auth import get_user_model

    from retention.domain import portfolio_model, property_model
    from retention.registry import get_spec

    User, Portfolio, Property = get_user_model(), portfolio_model(), property_model()
    Lease = get_spec("lease").model

# --- Test tiers ----------------------------------------------------------------------
# Every test has exactly one tier (markers registered in pyproject.toml, with
# --strict-markers), given explicitly (a ``pytestmark`` or a decorator) or read
# here from what the test uses:
#   unit         no database, no server: pure logic and the source's own rules;
#   database     PostgreSQL in a transaction that rolls back (``db``);
#   concurrency  committed data and real parallel connections or threads
#                (``transactional_db``, ``django_db(transaction=True)``);
#   system       processes, servers, browsers, brokers: what the fixtures in
#                SYSTEM_FIXTURES start, or any test of a module in SYSTEM_MODULES.
# ``make test-fast`` runs unit and database; ``make test`` runs every tier.
TIERS = ("unit", "database", "concurrency", "system")
SYSTEM_FIXTURES = frozenset({"docstore", "docstore_factory", "live_server", "store"})
# Modules whose tests start processes or servers in their own bodies (subprocess,
# qcluster, Chromium, moto's server, promtool, faketime, a pip install).
SYSTEM_MODULES = frozenset(
    {
        "test_alert_rules",
        "test_api_schemathesis",
        "test_attachment_storages",
        "test_brokers",
        "test_console_accessibility",
        "test_console_browser",
        "test_console_defects_browser",
        "test_console_incidents_browser",
        "test_console_recovery_browser",
        "test_demo_commands",
        "test_downstream_store_and_settings",
        "test_embedded_postgres",
        "test_host_user_model",
        "test_host_uuid_keys",
        "test_installable",
        "test_interleavings",
        "test_interleavings_compound",
        "test_live_application",
        "test_offline_docs",
        "test_proof_verify",
        "test_scale_to_zero",
        "test_settings",
        "test_single_company_host",
        "test_two_clusters",
        "test_workers",
    }
)


def tier_of(item: pytest.Item) -> str:
    """The one tier of ``item`` (explicit markers first; two explicit ones are an error)."""
    explicit = [name for name in TIERS if item.get_closest_marker(name) is not None]
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid}: more than one tier marker ({', '.join(explicit)})")
    if explicit:
        return explicit[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    if fixtures & SYSTEM_FIXTURES or module in SYSTEM_MODULES:
        return "system"
    django_db = item.get_closest_marker("django_db")
    transactional = "transactional_db" in fixtures or (
        django_db is not None and (django_db.kwargs.get("transaction") or (django_db.args and django_db.args[0]))
    )
    if transactional or "live_server" in fixtures:
        return "concurrency"
    if django_db is not None or "db" in fixtures or "django_db_setup" in fixtures:
        return "database"
    return "unit"


# --- pytest-xdist --------------------------------------------------------------------
# Each worker has its own test database (pytest-django's ``_gw0`` suffix), on the one
# PostgreSQL server. Tests that share something else — a broker server, the host
# projects' virtualenv, a rate or a latency measured on the wall clock — are one
# ``xdist_group``, which only ``--dist loadgroup`` honours: ``-n`` without a ``--dist``
# of its own distributes by group here (docs/developing.md, "In parallel").
WALL_CLOCK = pytest.mark.xdist_group("wall_clock")  # asserts a rate or a latency on the wall clock


def pytest_configure(config: pytest.Config) -> None:
    given = config.invocation_params.args

    def explicit(option: str) -> bool:
        return any(arg == option or arg.startswith(f"{option}=") for arg in given)

    if getattr(config.option, "dist", "no") == "load" and not explicit("--dist"):
        config.option.dist = "loadgroup"
    # pytest-django runs the rolled-back tests before the committing ones, whose flush
    # empties the tables (all but the migration's rows, put back); loadgroup's default
    # sends the largest groups first, a committing group ahead of a worker's rolled-back
    # tests. In collection order, each worker gets its tests in pytest-django's order.
    if getattr(config.option, "dist", "no") == "loadgroup" and not explicit("--loadscope-reorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    # A worker parses the command line again, where --dist loadgroup may be absent.
    node.workerinput["loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def xdist_group_of(item: pytest.Item) -> str:
    """The group pytest-xdist's loadgroup gives ``item`` ("" for none): its groups' names, joined."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names))


def database_use(item: pytest.Item) -> str:
    """How ``item`` uses the test database, as pytest-django orders the tests by it:
    "rolled back" (``db``), "committed" (a transactional test, a live server) or ""."""
    fixtures = set(getattr(item, "fixturenames", ()))
    marker = item.get_closest_marker("django_db")
    committed = marker is not None and bool(
        marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences") or (marker.args and marker.args[0])
    )
    if committed or fixtures & {"transactional_db", "django_db_reset_sequences", "live_server"}:
        return "committed"
    return "rolled back" if marker is not None or "db" in fixtures else ""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which sends the node ids to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    """A group runs in one piece where its first test is in pytest-django's order, so it
    must not mix rolled-back and committing tests. On a loadgroup worker each grouped
    test's node id ends in ``@<group>``: how the worker tells the controller's scheduler
    the group. pytest-xdist 3.8.0 writes it to the item's ``_nodeid``, which pytest 9.2's
    structured node ids (``Node._id``) no longer read, so the suffix is lost and every
    group is silently spread over the workers (pytest-dev/pytest-xdist#1386, unfixed in a
    release). Written here instead, unless xdist's own took (a release with the fix)."""
    uses: dict[str, dict[str, str]] = {}
    for item in session.items:
        if group := xdist_group_of(item):
            uses.setdefault(group, {}).setdefault(database_use(item), item.nodeid)
    for group, first in uses.items():
        if {"rolled back", "committed"} <= set(first):
            raise pytest.UsageError(
                f"xdist_group {group!r} mixes a rolled-back test ({first['rolled back']}) and a committing one "
                f"({first['committed']}): a worker would run the rolled-back one after a flush"
            )
    if not getattr(session.config, "workerinput", {}).get("loadgroup"):  # an xdist worker under loadgroup
        return
    from _pytest.nodeid import coerce_node_id  # pytest 9.2's node id type; not public

    for item in session.items:
        group, nodeid = xdist_group_of(item), item.nodeid
        if group and nodeid.rfind("@") <= nodeid.rfind("]"):
            item._id = coerce_node_id(f"{nodeid}@{group}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    # xdist hands tests out in collection order: a test of several minutes
    # collected last runs alone at the end while the other workers idle, so
    # those marked ``starts_first`` go to the front of what pytest-django's
    # order allows (a stable sort): one without the database before every
    # test, a committing one first among the committing tests, which must
    # still follow every rolled-back one (their flush empties the tables).
    items.sort(key=_start_rank)


# pytest-django's order by database use, and where a ``starts_first`` test of each goes.
_RANK = {"rolled back": 0.0, "committed": 1.0, "": 2.0}
_STARTS_FIRST_RANK = {"rolled back": 0.0, "committed": 0.5, "": -1.0}


def _start_rank(item: pytest.Item) -> float:
    ranks = _RANK if item.get_closest_marker("starts_first") is None else _STARTS_FIRST_RANK
    return ranks[database_use(item)]


# Each tier's share of the run: the sum of its tests' durations (setup, call and
# teardown; under xdist the controller sums its workers' reports, so the figures
# add up to more than the wall clock), printed at the end of every run.
_TIER_SECONDS: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = next((name for name in TIERS if name in report.keywords), "unknown")
    seconds, tests = _TIER_SECONDS.setdefault(tier, [0.0, 0])
    _TIER_SECONDS[tier] = [seconds + report.duration, tests + (report.when == "call")]


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _TIER_SECONDS:
        parts = [
            f"{tier} {seconds:.0f} s ({int(tests)} tests)" for tier, (seconds, tests) in sorted(_TIER_SECONDS.items())
        ]
        terminalreporter.write_line("time by tier (sum of test durations): " + ", ".join(parts))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI nothing may be skipped: a browser or broker test that did not run
    # is a failure there, never a silent pass.
    if os.environ.get("CI") != "true":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped:
        reporter.write_line(f"CI=true: {skipped} test(s) were skipped; CI requires every test to run.", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    from django.core.cache import cache

    from cleanup_ops.ratelimit import runtime_limits_forget

    cache.clear()  # cached figures (retention debt) must not leak between tests
    runtime_limits_forget()  # nor this process's copy of the run-time limits


@pytest.fixture(autouse=True)
def _no_heartbeat_flush_across_tests():  # type: ignore[no-untyped-def]
    """A throttled heartbeat's flush timer (cleanup_ops.health) belongs to the
    test that started it: left running, it would write a heartbeat row on its
    own connection into a later test's database."""
    yield
    from cleanup_ops import health

    with health._lock:
        if health._flush_timer is not None:
            health._flush_timer.cancel()
            health._flush_timer = None


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Users are created in many tests; the production hasher is slow on purpose (PBKDF2,
    about 0.4 s a user here). For the whole session, not per test: the module-scoped
    worlds (``tests/crawler_world.py``: eleven users) are built before any test's own
    fixtures, and spent most of their five seconds hashing."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


# --- The migration's rows, after a flush ----------------------------------------------
# A flush empties every table, the four the migration filled for the whole product
# too: the content types and the permissions (django.contrib's ``post_migrate``
# receivers) and the role groups with their grants (retention's data migrations).
# Django's flush sends ``post_migrate`` again, whose two receivers make every content
# type and permission anew, app by app: about 80 statements, 0.14 s of each of some
# 1,900 committing tests. Here the flush puts back the rows those four tables held
# right after ``migrate`` (read once, ``django_db_setup``), with their ids, in one
# statement each, and then sends ``post_migrate`` without those two receivers (the
# reference guards' receiver replaces only a trigger a test left missing or different). So
# every test, the first on a worker or one after a flush, sees the database the
# migration made, role groups included, and a content type keeps its id for the session.

_MIGRATION_ROWS: list[tuple[str, str]] | None = None  # (table, its rows as JSON), parents first


def migration_rows_tables() -> list[str]:
    """The tables the migration filled that a flush empties, a referenced one before its referrers."""
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    return [model._meta.db_table for model in (ContentType, Permission, Group, Group.permissions.through)]


def migration_rows_read() -> list[tuple[str, str]]:
    from psycopg import sql

    rows = []
    with connection.cursor() as cur:
        for table in migration_rows_tables():
            cur.execute(
                sql.SQL("SELECT coalesce(json_agg(t), '[]') FROM {table} t").format(table=sql.Identifier(table))
            )
            (listed,) = cur.fetchone()
            rows.append((table, listed if isinstance(listed, str) else json.dumps(listed)))
    return rows


def migration_rows_restore(*, using: str) -> None:
    """Put back the rows read after ``migrate``, with their ids; each table's identity
    continues after its largest id (a flush may have reset it)."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connections, transaction
    from psycopg import sql

    with transaction.atomic(using=using), connections[using].cursor() as cur:
        for table, listed in _MIGRATION_ROWS or []:
            cur.execute(
                sql.SQL(
                    """
                    WITH put AS (
                        INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %(rows)s::json)
                        RETURNING id
                    )
                    SELECT setval(pg_get_serial_sequence(%(name)s, 'id'), max(id)) FROM put HAVING count(*) > 0
                    """
                ).format(table=sql.Identifier(table)),
                {"rows": listed, "name": table},
            )
    # Django's create_contenttypes clears the cache too: a content type a test made is gone.
    ContentType.objects.clear_cache()


_DJANGO_EMIT_POST_MIGRATE = None


def emit_post_migrate_after_flush(verbosity: int, interactive: bool, db: str, **kwargs: object) -> None:
    """The flush command's ``emit_post_migrate_signal``: the migration's rows put back,
    then ``post_migrate`` to every receiver but the two that would make them again."""
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.db.models.signals import post_migrate

    migration_rows_restore(using=db)
    auth_uid = "django.contrib.auth.management.create_permissions"
    post_migrate.disconnect(dispatch_uid=auth_uid)
    post_migrate.disconnect(create_contenttypes)
    try:
        _DJANGO_EMIT_POST_MIGRATE(verbosity, interactive, db, **kwargs)  # type: ignore[misc]
    finally:
        post_migrate.connect(create_contenttypes)
        post_migrate.connect(create_permissions, dispatch_uid=auth_uid)


@pytest.fixture(scope="session", autouse=True)
def _flush_puts_the_migration_rows_back():  # type: ignore[no-untyped-def]
    global _DJANGO_EMIT_POST_MIGRATE
    from django.core.management.commands import flush

    _DJANGO_EMIT_POST_MIGRATE = flush.emit_post_migrate_signal
    flush.emit_post_migrate_signal = emit_post_migrate_after_flush
    yield
    flush.emit_post_migrate_signal = _DJANGO_EMIT_POST_MIGRATE


# --- The flush between committing tests ------------------------------------------------
# Django's flush (TransactionTestCase's teardown) empties every table of every model in
# one TRUNCATE: here about 80 tables, tenant activity's 180 table partitions and their
# 950 indexes, each given a new file whether it held a row or not — about a second, most
# of a short committing test's cost. The flush below empties the same tables: it finds
# the leaves (a partitioned table's partitions, an ordinary table itself) that hold a
# row and deletes their rows, with triggers off (``session_replication_role = replica``:
# the append-only triggers of the audit trail and the ledger, which refuse a DELETE, and
# the foreign-key checks, moot when every referencing row goes too — no table outside
# the list references one in it, or Django's TRUNCATE would fail). Every table is empty
# afterwards, as before, and sequences are not reset, as before; ``post_migrate`` is
# sent as before. A flush that resets sequences (reset_sequences, the ``flush``
# command's default), or a database role that may not turn triggers off, keeps
# Django's own TRUNCATE.


def flush_sql_of_rows(ops, style, tables, *, reset_sequences=False, allow_cascade=False):  # type: ignore[no-untyped-def]
    """``DatabaseOperations.sql_flush``: the statements that empty ``tables``, for their leaves that hold rows."""
    if ops.connection.in_atomic_block:
        # A flush inside a test's transaction: its rows are not committed, and the probe's
        # connection would not see them.
        return _DJANGO_SQL_FLUSH(ops, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    cur = flush_probe_connection(ops.connection).cursor()
    (superuser,) = cur.execute("SELECT current_setting('is_superuser') = 'on'").fetchone()  # type: ignore[misc]
    if reset_sequences or not tables or not superuser:
        return _DJANGO_SQL_FLUSH(ops, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    cur.execute(
        # A partitioned table's leaves; an ordinary table is in no partition tree.
        "SELECT coalesce(p.relid, t.oid)::regclass::text FROM"
        " (SELECT quote_ident(name)::regclass AS oid FROM unnest(%s::text[]) name) t"
        " LEFT JOIN LATERAL pg_partition_tree(t.oid) p ON true WHERE p.relid IS NULL OR p.isleaf",
        [sorted(tables)],
        prepare=True,
    )
    leaves = [name for (name,) in cur.fetchall()]
    probes = (f"SELECT {i} WHERE EXISTS (SELECT FROM {name})" for i, name in enumerate(leaves))
    # The same text flush after flush (until a table partition is dropped): planned once.
    cur.execute(" UNION ALL ".join(probes), prepare=True)  # type: ignore[call-overload]
    full = [leaves[i] for (i,) in cur.fetchall()]
    # Run in one transaction (DatabaseOperations.execute_sql_flush): SET LOCAL ends with it.
    return ["SET LOCAL session_replication_role = replica;", *(f"DELETE FROM {name};" for name in full)]


# The probe runs on a connection of its own, kept for the session: Django closes its
# connection after every committing test (TransactionTestCase._post_teardown), and a new
# backend opens each of the ~230 leaves the probe reads from cold catalog caches — 55 ms
# a flush against 4 on a connection that has read them before.
_FLUSH_PROBE_CONNECTIONS: dict[str, object] = {}


def flush_probe_connection(wrapper):  # type: ignore[no-untyped-def]
    """A psycopg connection (autocommit) to ``wrapper``'s database, opened once.
    It reads what is committed, as the flush's own connection does between tests."""
    import psycopg

    params = wrapper.get_connection_params()
    key = f"{wrapper.alias}:{params.get('dbname')}"
    conn = _FLUSH_PROBE_CONNECTIONS.get(key)
    if conn is None or conn.closed:  # type: ignore[attr-defined]
        keep = ("dbname", "user", "password", "host", "port", "sslmode", "options")
        conn = psycopg.connect(**{name: params[name] for name in keep if params.get(name)}, autocommit=True)
        _FLUSH_PROBE_CONNECTIONS[key] = conn
    return conn


_DJANGO_SQL_FLUSH = None


@pytest.fixture(scope="session", autouse=True)
def _flush_only_rows():  # type: ignore[no-untyped-def]
    global _DJANGO_SQL_FLUSH
    from django.db.backends.postgresql.operations import DatabaseOperations

    _DJANGO_SQL_FLUSH = DatabaseOperations.sql_flush
    DatabaseOperations.sql_flush = flush_sql_of_rows  # type: ignore[method-assign]
    yield
    DatabaseOperations.sql_flush = _DJANGO_SQL_FLUSH  # type: ignore[method-assign]


# Table partitions of the demo's tenant activity (properties 0006), as the
# migration made them: (name, bound expression), read once.
_TABLE_PARTITIONS: list[tuple[str, str]] | None = None
TENANT_ACTIVITY_TABLE = "properties_tenantactivity"


def _commits(request: pytest.FixtureRequest) -> bool:
    """Whether the test commits (a transactional test, a live server): its
    DDL is not undone by a rollback."""
    if set(request.fixturenames) & {"transactional_db", "live_server", "django_db_reset_sequences"}:
        return True
    marker = request.node.get_closest_marker("django_db")
    return bool(marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))


def table_partitions_listed() -> list[tuple[str, str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
            [TENANT_ACTIVITY_TABLE],
        )
        return [(name, bound) for name, bound in cur.fetchall()]


def table_partitions_restore() -> list[str]:
    """Make again every table partition of tenant activity that a committed
    drop (the sweep's, in this process or a worker's) took, with its bounds;
    a test's rows that fell into the DEFAULT one meanwhile are deleted first
    (the test is over: its data goes with the flush anyway). The names made."""
    listed = table_partitions_listed()
    missing = [(name, bound) for name, bound in _TABLE_PARTITIONS or [] if (name, bound) not in listed]
    with connection.cursor() as cur:
        for name, bound in missing:
            low, high = bound.removeprefix("FOR VALUES FROM (").removesuffix(")").split(") TO (")
            cur.execute(
                f"DELETE FROM {TENANT_ACTIVITY_TABLE}_default WHERE occurred_at >= {low} AND occurred_at < {high}"
            )
            cur.execute(f"CREATE TABLE {name} PARTITION OF {TENANT_ACTIVITY_TABLE} {bound}")
    return [name for name, _ in missing]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    """The test database, migrated; tenant activity's table partitions and the rows
    the migration filled (content types, permissions, role groups) read as the
    migration made them, before any test runs."""
    global _TABLE_PARTITIONS, _MIGRATION_ROWS
    with django_db_blocker.unblock():
        _TABLE_PARTITIONS = table_partitions_listed()
        _MIGRATION_ROWS = migration_rows_read()
    yield
    # Before pytest-django drops the test database, which it refuses while a session is open.
    for conn in _FLUSH_PROBE_CONNECTIONS.values():
        conn.close()  # type: ignore[attr-defined]
    _FLUSH_PROBE_CONNECTIONS.clear()


@pytest.fixture(autouse=True)
def _table_partitions_kept(request: pytest.FixtureRequest, django_db_blocker):  # type: ignore[no-untyped-def]
    """A test marked ``table_partitions`` (it drops tenant activity's table
    partitions, or reads them) starts and ends with them as the migration made
    them: a drop is DDL, and a committed one (a committing test's sweep, a worker
    process's) is not undone by the flush. A rolled-back test's drops are undone by
    its rollback, so they are not made again after it (inside its transaction that
    would be rolled back too); a committed drop of another connection during one is
    made good by the next committing test's end. Any other test pays nothing, but a
    committing one that dropped a table partition all the same fails here, naming
    the marker it lacks."""
    marked = request.node.get_closest_marker("table_partitions") is not None
    if not marked and not _commits(request):
        yield
        return
    request.getfixturevalue("django_db_setup")
    if marked:
        with django_db_blocker.unblock():
            table_partitions_restore()
    yield
    with django_db_blocker.unblock():
        if not _commits(request):
            # Made again here, inside the test's transaction, they would go with its
            # rollback, which comes next and puts back every one it dropped (0.5 s saved).
            return
        restored = table_partitions_restore()
    if restored and not marked:
        pytest.fail(
            f"{request.node.nodeid} dropped table partitions of tenant activity ({', '.join(restored)}): "
            "mark it @pytest.mark.table_partitions (tests/conftest.py, _table_partitions_kept)"
        )


@pytest.fixture
def row_deletes_only(settings):  # type: ignore[no-untyped-def]
    """The demo's kinds with tenant activity cleaned by row deletes only, for
    tests that count jobs, batches or ledger rows (whole table partitions
    dropped: test_table_partitions.py)."""
    from retention.registry import DEFAULT_RECORD_KINDS, registry_reload

    kinds = {**DEFAULT_RECORD_KINDS}
    kinds["tenant_activity"] = {**kinds["tenant_activity"], "drop_table_partitions": False}
    settings.RETENTION_RECORD_KINDS = kinds
    registry_reload()
    yield
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


def make_user(username: str, *groups: str) -> User:
    user = User.objects.create_user(username=username, password="pw-for-tests", is_staff=True)
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return User.objects.get(pk=user.pk)  # fresh instance: no stale permission cache


@pytest.fixture
def manager(db: None) -> User:
    return make_user("manager", "property_manager")


@pytest.fixture
def reviewer(db: None) -> User:
    return make_user("reviewer", "compliance_reviewer")


@pytest.fixture
def second_reviewer(db: None) -> User:
    return make_user("reviewer2", "compliance_reviewer")


@pytest.fixture
def operator_user(db: None) -> User:
    return make_user("operator", "operator")


@pytest.fixture
def auditor(db: None) -> User:
    return make_user("auditor", "auditor")


@pytest.fixture
def portfolio(db: None) -> Portfolio:
    return Portfolio.objects.create(name="Acme Lettings", slug="acme")


@pytest.fixture
def prop(portfolio: Portfolio) -> Property:
    return Property.objects.create(portfolio=portfolio, name="Harbour House")


ActivePolicy = Callable[..., PolicyVersion]


@pytest.fixture
def active_policy(manager: User, reviewer: User) -> ActivePolicy:
    """Give (portfolio, kind) an approved version with ``days`` of retention."""

    def make(portfolio: Portfolio, kind: str, days: int, *, enabled: bool = True) -> PolicyVersion:
        policy: RetentionPolicy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
        version = policy_version_submit(
            policy=policy, retention_days=days, enabled=enabled, author=manager, reason="test policy"
        )
        return policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")

    return make


# --- Lock waits, observed rather than timed (PostgreSQL) ----------------------


def backend_pid() -> int:
    """This thread's PostgreSQL backend: what another thread looks up in pg_stat_activity."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def wait_until_blocked(pid: int, *, by: int, timeout: float = 10.0) -> list[tuple[str, str]]:
    """Poll until backend ``pid`` waits on a lock held by backend ``by``.

    Returns the locks it waits for (``pg_locks``: lock type, mode, not
    granted). The proof that a statement queued behind another transaction's
    lock, where a sleep would only prove that some time passed.
    """
    import time

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT a.wait_event_type, %s = ANY(pg_blocking_pids(a.pid)) FROM pg_stat_activity a WHERE a.pid = %s",
                [by, pid],
            )
            row = cursor.fetchone()
            if row is not None and row[0] == "Lock" and row[1]:
                cursor.execute("SELECT locktype, mode FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
                return [(str(locktype), str(mode)) for locktype, mode in cursor.fetchall()]
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock held by backend {by}")


def hold_placed_during_a_purge_call(
    *, job_id: int, prop: Property, reviewer: User, call_sent: Callable[[], object], check_call: Callable[[], None]
) -> object:
    """One purge batch of job ``job_id`` in a thread, its store call answered late; once
    ``call_sent()`` says the call is in flight (and ``check_call()`` has checked what
    was sent), a hold on ``prop`` placed from a second thread must queue behind the
    purge's lock, held across the call. Both threads joined; returns the hold placed.

    The scaffolding of "a hold placed while a delete is in flight waits for it",
    whichever store answers late (the HTTP document store, S3's ``DeleteObjects``).
    """
    import threading
    import time

    from django.db import connections

    from cleanup_ops.execution.runner import job_run_slice
    from retention.services import legal_hold_place

    pids: dict[str, int] = {}
    placed: list = []  # type: ignore[type-arg]
    errors: list[BaseException] = []
    purge_started = threading.Event()

    def purge_one_batch() -> None:
        try:
            pids["purge"] = backend_pid()
            purge_started.set()
            job_run_slice(job_id=job_id, owner="purger", max_batches=1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def place_hold() -> None:
        try:
            pids["hold"] = backend_pid()
            placed.append(
                legal_hold_place(
                    portfolio=prop.portfolio, property=prop, placed_by=reviewer, reason="late for the tests"
                )
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    purger = threading.Thread(target=purge_one_batch)
    purger.start()
    holder = None
    try:
        assert purge_started.wait(10)
        deadline = time.monotonic() + 10
        while not call_sent() and time.monotonic() < deadline:
            time.sleep(0.01)
        check_call()
        holder = threading.Thread(target=place_hold)
        holder.start()
        while "hold" not in pids and time.monotonic() < deadline:
            time.sleep(0.01)
        # The hold's FOR UPDATE queues behind the purge's share lock, held across the call.
        assert wait_until_blocked(pids["hold"], by=pids["purge"]) == [("transactionid", "ShareLock")]
        assert not placed
    finally:
        purger.join(30)
        if holder is not None:
            holder.join(30)
    assert errors == [] and len(placed) == 1
    return placed[0]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def make_records(prop: Property, kind: str, count: int, *, ended: datetime) -> list[int]:
    """``count`` rows of ``kind`` in ``prop`` whose retention timestamp is ``ended``."""
    from retention.registry import get_spec

    # The builder of the app whose model the kind names (properties.records: the demo's).
    record_build = import_module(f"{get_spec(kind).model._meta.app_config.name}.records").record_build
    objs = [record_build(kind, portfolio_id=prop.portfolio_id, property_id=prop.pk, at=ended) for _ in range(count)]
    model = type(objs[0])
    model.objects.bulk_create(objs)
    return list(model.objects.filter(property_id=prop.pk).order_by("-id").values_list("id", flat=True)[:count])[::-1]


def one_property_portfolios(active_policy, names: list[str], rows: int = 3) -> dict[str, Property]:  # type: ignore[no-untyped-def]
    """One portfolio per name, one property each, ``rows`` expired leases."""
    props = {}
    for name in names:
        portfolio = Portfolio.objects.create(name=f"Portfolio {name}", slug=name.lower())
        active_policy(portfolio, "lease", 365)
        prop = Property.objects.create(portfolio=portfolio, name=f"House {name}")
        make_records(prop, "lease", rows, ended=utc("2020-01-01T00:00:00Z"))
        props[name] = prop
    return props


def make_lease_estate(*, portfolios: int = 3, properties: int = 2, rows: int = 40) -> list[Property]:
    """Portfolios P0.. with an approved 365-day lease policy, properties B0..
    each, ``rows`` long-expired leases per property (the worker tests' data)."""
    manager = make_user("m", "property_manager")
    reviewer = make_user("r", "compliance_reviewer")
    props = []
    for p_index in range(portfolios):
        portfolio = Portfolio.objects.create(name=f"P{p_index}", slug=f"p{p_index}")
        policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
        version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="r for the tests")
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
        for q in range(properties):
            prop = Property.objects.create(portfolio=portfolio, name=f"B{q}")
            make_records(prop, "lease", rows, ended=utc("2020-01-01T00:00:00Z"))
            props.append(prop)
    return props


def remaining_ids(prop: Property, kind: str) -> set[int]:
    from retention.registry import get_spec

    return set(get_spec(kind).model.objects.filter(property_id=prop.pk).values_list("id", flat=True))


# --- Downstream purge: the demo document store on loopback --------------------


class DocstoreProcess:
    """The demo document store (``python -m docstore``) in a subprocess on a free loopback port.

    A separate process on purpose: it keeps the real clock while a test
    freezes its own with time-machine, and it is the same program ``make demo``
    runs. Admin calls (faults, request log) go to its loopback admin endpoints.
    """

    def __init__(self, db_path: str, *flags: str) -> None:
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "docstore", "--port", "0", "--db", db_path, *flags],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("docstore listening on http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the document store did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1]

    def _admin(self, method: str, path: str, payload: object | None = None) -> object:
        import httpx

        from cleanup_ops.downstream.client import tls_context

        # The product's shared context: httpx's default would be built anew per call (20 ms of CPU).
        response = httpx.request(
            method, f"{self.url}/_admin/{path}", json=payload, timeout=5, trust_env=False, verify=tls_context()
        )
        response.raise_for_status()
        return response.json()

    def set_faults(self, **faults: object) -> None:
        self._admin("POST", "faults", faults)

    def clear_faults(self) -> None:
        self._admin("DELETE", "faults")

    def create(self, *ids: str) -> None:
        self._admin("POST", "documents", {"ids": list(ids)})

    def documents(self) -> set[str]:
        return set(self._admin("GET", "documents"))  # type: ignore[arg-type]

    def requests(self, method: str = "DELETE") -> list[dict]:
        return [r for r in self._admin("GET", "requests") if r["method"] == method]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def docstore_factory(tmp_path, settings):  # type: ignore[no-untyped-def]
    """Start a document store with extra flags; DOCSTORE_URL points at the last one started."""
    started: list[DocstoreProcess] = []

    def start(*flags: str) -> DocstoreProcess:
        store = DocstoreProcess(str(tmp_path / f"docstore-{len(started)}.sqlite3"), *flags)
        started.append(store)
        settings.DOCSTORE_URL = store.url
        return store

    yield start
    for store in started:
        store.stop()


@pytest.fixture
def docstore(docstore_factory):  # type: ignore[no-untyped-def]
    """The document store with no rate limit and no faults."""
    return docstore_factory()


@pytest.fixture
def silent_listener():  # type: ignore[no-untyped-def]
    """A second loopback listener that must receive nothing: yields (port, connections seen)."""
    import socket
    import threading

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)
    seen: list[tuple[str, int]] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            seen.append(addr)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join(timeout=2)
    server.close()


# --- Host projects ---------------------------------------------------------------------
# A host project's own database (tests/test_installable.py, tests/test_host_user_model.py, tests/test_host_uuid_keys.py,
# tests/test_single_company_host.py).


def database_setting(url: str, name: str) -> dict[str, object]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


@pytest.fixture
def host_database():
    """A database of its own on the suite's PostgreSQL server (the URL names the suite's, which
    pytest-django replaces with a test database), dropped afterwards."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    name = f"host_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, dbname="postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield database_setting(url, name)
    with psycopg.connect(url, dbname="postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
