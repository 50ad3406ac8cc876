"""The benchmark's datasets, the file-level snapshot every run starts from, and the check
that a run deleted exactly the eligible rows.

Two shapes:

* ``backlog`` (the first cleanup): leases only, 100 portfolios (one big one with half
  of the rows over 10 properties), ~96% of the rows past the cutoff;
* ``nightly`` (every night after that): 150 portfolios x 10 properties, all three record
  kinds, ~1% of the rows just past the cutoff, 1% of the properties and some records
  held. ``document_id`` stays NULL (no purge jobs), as in the backlog shape.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bench.common import log, sql, text, try_sql
from harness import postgres
from harness.postgres import admin_url

KIND = "lease"
TABLE = "properties_lease"
KINDS = ("lease", "maintenance_record", "tenant_activity")
RETENTION_DAYS = 365
BIG_PROPERTIES = 10  # the big portfolio: half of all rows over this many properties
SMALL_PORTFOLIOS = 99
SMALL_PROPERTIES = 3  # properties per small portfolio
HELD_SMALL_PORTFOLIOS = (10, 25, 40, 55, 70, 85)  # first property of each gets a property-level hold
RECORD_HOLDS = 40  # record-level holds: half in the big portfolio, half spread over small ones
# The nightly shape.
NIGHTLY_PORTFOLIOS = 150
NIGHTLY_PROPERTIES = 10  # per portfolio
NIGHTLY_EXPIRED = 0.01  # share of rows past the cutoff (crossed it within the last 30 days)
NIGHTLY_HELD_PROPERTIES = 0.01  # share of properties under a property-level hold
NIGHTLY_RECORD_HOLDS = 15  # record-level holds per kind, on rows past the cutoff


def cleanup_tables() -> str:
    """Every pipeline table (sweeps, jobs, ledger, dead letters, buckets, pauses…) and the broker's."""
    from django.db import connection

    names = [t for t in connection.introspection.table_names() if t.startswith("cleanup_ops_")]
    return ", ".join([*sorted(names), "django_q_ormq", "django_q_task"])


def record_tables() -> str:
    from retention.registry import REGISTRY

    return ", ".join(spec.table for spec in REGISTRY.values())


@dataclass
class Scope:
    big_portfolio: int | None  # None in the nightly shape (no portfolio stands out)
    properties: list[tuple[int, int]]  # (property id, portfolio id), big portfolio first
    manager: Any
    reviewer: Any
    shape: str = "backlog"
    kinds: tuple[str, ...] = (KIND,)
    portfolios: int = 1 + SMALL_PORTFOLIOS


@dataclass
class KindStats:
    """One record kind's figures on the snapshot: what a correct run deletes and leaves."""

    table: str
    eligible: int
    eligible_id_sum: int
    held: int  # rows past the cutoff under a hold: they must survive
    total: int
    total_id_sum: int


@dataclass
class Dataset:
    rows: int
    cutoff: datetime
    kinds: dict[str, KindStats]
    holds: int
    generate_seconds: float
    shape: str = "backlog"

    @property
    def eligible(self) -> int:
        return sum(k.eligible for k in self.kinds.values())

    @property
    def held(self) -> int:
        return sum(k.held for k in self.kinds.values())

    @property
    def total(self) -> int:
        return sum(k.total for k in self.kinds.values())

    def describe(self) -> str:
        kinds = ", ".join(
            f"{kind} {k.total:,} ({k.eligible:,} eligible, {k.held:,} held)" for kind, k in self.kinds.items()
        )
        return kinds


def make_user(username: str, group: str) -> Any:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(username=username, password=secrets.token_hex(8), is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def build_scope() -> Scope:
    """Users, 100 portfolios (one big), their properties and an approved policy each."""
    from properties.models import Portfolio, Property
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    if Portfolio.objects.exists():
        raise SystemExit("bench: the database already has portfolios; point DATABASE_URL at an empty database")
    manager = make_user("bench-manager", "property_manager")
    reviewer = make_user("bench-reviewer", "compliance_reviewer")
    portfolios = Portfolio.objects.bulk_create(
        [Portfolio(name="Big Lettings", slug="big")]
        + [Portfolio(name=f"Small Lettings {i}", slug=f"small-{i:03d}") for i in range(1, SMALL_PORTFOLIOS + 1)]
    )
    props = [Property(portfolio=portfolios[0], name=f"Big tower {i}") for i in range(1, BIG_PROPERTIES + 1)]
    for po in portfolios[1:]:
        props += [Property(portfolio=po, name=f"{po.slug} house {i}") for i in range(1, SMALL_PROPERTIES + 1)]
    props = Property.objects.bulk_create(props)
    for po in portfolios:
        policy = retention_policy_get_or_create(portfolio=po, record_kind=KIND)
        version = policy_version_submit(
            policy=policy, retention_days=RETENTION_DAYS, author=manager, reason="benchmark policy"
        )
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="benchmark: seeded, approved")
    return Scope(portfolios[0].pk, [(p.pk, p.portfolio_id) for p in props], manager, reviewer)


def build_nightly_scope(portfolios: int = NIGHTLY_PORTFOLIOS, per_portfolio: int = NIGHTLY_PROPERTIES) -> Scope:
    """Users, ``portfolios`` portfolios of ``per_portfolio`` properties, and per portfolio an
    approved 365-day policy for every record kind (submitted and approved through
    ``retention.services``, as in production)."""
    from properties.models import Portfolio, Property
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    if Portfolio.objects.exists():
        raise SystemExit("bench: the database already has portfolios; point DATABASE_URL at an empty database")
    manager = make_user("bench-manager", "property_manager")
    reviewer = make_user("bench-reviewer", "compliance_reviewer")
    pos = Portfolio.objects.bulk_create(
        [Portfolio(name=f"Nightly Lettings {i}", slug=f"nightly-{i:04d}") for i in range(1, portfolios + 1)]
    )
    props = Property.objects.bulk_create(
        [Property(portfolio=po, name=f"{po.slug} house {i}") for po in pos for i in range(1, per_portfolio + 1)]
    )
    for po in pos:
        for kind in KINDS:
            policy = retention_policy_get_or_create(portfolio=po, record_kind=kind)
            version = policy_version_submit(
                policy=policy, retention_days=RETENTION_DAYS, author=manager, reason="benchmark policy"
            )
            policy_version_approve(version_id=version.pk, reviewer=reviewer, note="benchmark: seeded, approved")
    return Scope(
        None,
        [(p.pk, p.portfolio_id) for p in props],
        manager,
        reviewer,
        shape="nightly",
        kinds=KINDS,
        portfolios=portfolios,
    )


def load_records(scope: Scope, rows: int, slot: datetime) -> Dataset:
    """``rows`` leases, ~96% past the cutoff, ~1% held; snapshot into the pristine copy."""
    from properties.models import Portfolio, Property
    from retention.services import legal_hold_place

    started = time.perf_counter()
    cutoff = slot - timedelta(days=RETENTION_DAYS)
    sql(f"TRUNCATE {cleanup_tables()}, {TABLE}, retention_legalhold RESTART IDENTITY CASCADE")
    sql("DROP TABLE IF EXISTS bench_slots")
    sql("CREATE TEMP TABLE bench_slots (idx int PRIMARY KEY, property_id bigint, portfolio_id bigint)")
    sql(
        "INSERT INTO bench_slots SELECT g - 1, (v.a)[g], (v.b)[g] FROM (SELECT %s::bigint[] a, %s::bigint[] b) v,"
        " generate_series(1, %s) g",
        [[p for p, _ in scope.properties], [po for _, po in scope.properties], len(scope.properties)],
    )
    n_small = len(scope.properties) - BIG_PROPERTIES
    # Interleaved ids (records arrive over time across properties); even rows go
    # to the big portfolio. 2% running leases (NULL), 2% ended recently, the
    # rest ended 400-1900 days before the slot.
    with fk_triggers_off():
        sql("SELECT setseed(0.42)")
        sql(
            f"INSERT INTO {TABLE} (portfolio_id, property_id, unit, tenant_name, started_on, ended_at)"
            " SELECT s.portfolio_id, s.property_id, 'U-' || mod(y.g, 400), 'Tenant ' || y.g,"
            " (COALESCE(y.e, %s) - interval '700 days')::date, y.e"
            " FROM (SELECT x.g, CASE WHEN mod(x.g, 2) = 0 THEN mod(x.g / 2, %s) ELSE %s + mod(x.g / 2, %s) END AS idx,"
            "   CASE WHEN x.h < 0.02 THEN NULL WHEN x.h < 0.04 THEN %s - interval '30 days'"
            "        ELSE %s - interval '400 days' - floor(x.h * 1500) * interval '1 day' END AS e"
            "   FROM (SELECT g, random() AS h FROM generate_series(1, %s) g) x) y"
            " JOIN bench_slots s ON s.idx = y.idx ORDER BY y.g",
            [slot, BIG_PROPERTIES, BIG_PROPERTIES, n_small, slot, slot, rows],
        )
    sql(f"ANALYZE {TABLE}")
    # Legal holds, placed through the service (scope locks, audit events).
    by_portfolio: dict[int, list[int]] = defaultdict(list)
    for prop_id, po_id in scope.properties:
        by_portfolio[po_id].append(prop_id)
    small_portfolios = [po for po in by_portfolio if po != scope.big_portfolio]
    held_props = [by_portfolio[small_portfolios[i - 1]][0] for i in HELD_SMALL_PORTFOLIOS]
    for prop in Property.objects.filter(pk__in=held_props).select_related("portfolio"):
        legal_hold_place(portfolio=prop.portfolio, property=prop, placed_by=scope.reviewer, reason="bench: litigation")
    picks = sql(
        f"SELECT id, portfolio_id, property_id FROM {TABLE} WHERE portfolio_id = %s ORDER BY md5(id::text) LIMIT %s",
        [scope.big_portfolio, RECORD_HOLDS // 2],
    ) + sql(
        f"SELECT id, portfolio_id, property_id FROM {TABLE} WHERE portfolio_id <> %s"
        " AND NOT (property_id = ANY(%s)) ORDER BY md5(id::text) LIMIT %s",
        [scope.big_portfolio, held_props, RECORD_HOLDS - RECORD_HOLDS // 2],
    )
    portfolios = {po.pk: po for po in Portfolio.objects.all()}
    for record_id, po_id, _prop_id in picks:
        legal_hold_place(
            portfolio=portfolios[po_id],
            record_kind=KIND,
            record_id=record_id,
            placed_by=scope.reviewer,
            reason="bench: subject access request",
        )
    sql("DROP TABLE bench_slots")
    sql(f"VACUUM ANALYZE {TABLE}")
    generate_seconds = time.perf_counter() - started
    holds = sql("SELECT count(*) FROM retention_legalhold")[0][0]
    return Dataset(rows, cutoff, {KIND: kind_stats(KIND, cutoff)}, holds, generate_seconds)


def kind_stats(kind: str, cutoff: datetime) -> KindStats:
    """What the eligibility predicate admits of ``kind`` now (count, id sum), the held rows
    past the cutoff, and the table's count and id sum."""
    from retention.eligibility import db_datetime, eligible_sql, hold_covers_sql
    from retention.registry import get_spec

    spec = get_spec(kind)
    table, ts = spec.table, spec.timestamp_column
    predicate, params = eligible_sql(kind, cutoff=cutoff, alias="r")
    pred = text(predicate)
    eligible, eligible_sum = sql(f"SELECT count(*), COALESCE(sum(r.id), 0) FROM {table} r WHERE {pred}", params)[0]
    covers, hold_params = hold_covers_sql(kind, alias="r")
    hold_sql = text(covers)
    held = sql(f"SELECT count(*) FROM {table} r WHERE r.{ts} < %s AND {hold_sql}", [db_datetime(cutoff), *hold_params])[
        0
    ][0]
    total, total_sum = sql(f"SELECT count(*), COALESCE(sum(id), 0) FROM {table}")[0]
    return KindStats(table, int(eligible), int(eligible_sum), int(held), int(total), int(total_sum))


# Per record kind: the columns the nightly loader fills, as SQL over the generated
# ``y.g`` (row number) and ``y.e`` (the retention timestamp, NULL for open records).
_NIGHTLY_COLUMNS = {
    "lease": (
        "unit, tenant_name, started_on, ended_at",
        "'U-' || mod(y.g, 400), 'Tenant ' || y.g, (COALESCE(y.e, %(slot)s) - interval '700 days')::date, y.e",
        True,
    ),
    "maintenance_record": (
        "summary, opened_at, closed_at",
        "'Work order ' || y.g, COALESCE(y.e, %(slot)s) - interval '12 days', y.e",
        True,
    ),
    "tenant_activity": ("activity_type, details, occurred_at", "'payment', '', y.e", False),
}


def load_nightly(scope: Scope, rows: int, slot: datetime, expired: float = NIGHTLY_EXPIRED) -> Dataset:
    """``rows`` records split evenly over the three kinds and over every property (ids
    interleaved across properties, as records arriving over time). ``expired`` of them
    crossed the 365-day cutoff within the last 30 days; 3% of leases and maintenance
    records are still open (NULL timestamp); the rest are younger than the cutoff.
    Holds: ``NIGHTLY_HELD_PROPERTIES`` of the properties (one in every 100, spread over
    the portfolios) and ``NIGHTLY_RECORD_HOLDS`` records past the cutoff per kind, placed
    through ``legal_hold_place``. ``document_id`` stays NULL: no purge jobs."""
    from properties.models import Portfolio, Property
    from retention.registry import get_spec
    from retention.services import legal_hold_place

    started = time.perf_counter()
    cutoff = slot - timedelta(days=RETENTION_DAYS)
    sql(f"TRUNCATE {cleanup_tables()}, {record_tables()}, retention_legalhold RESTART IDENTITY CASCADE")
    sql("DROP TABLE IF EXISTS bench_slots")
    sql("CREATE TEMP TABLE bench_slots (idx int PRIMARY KEY, property_id bigint, portfolio_id bigint)")
    sql(
        "INSERT INTO bench_slots SELECT g - 1, (v.a)[g], (v.b)[g] FROM (SELECT %s::bigint[] a, %s::bigint[] b) v,"
        " generate_series(1, %s) g",
        [[p for p, _ in scope.properties], [po for _, po in scope.properties], len(scope.properties)],
    )
    n_props = len(scope.properties)
    per_kind = rows // len(scope.kinds)
    with fk_triggers_off():
        sql("SELECT setseed(0.42)")
        for kind in scope.kinds:
            spec = get_spec(kind)
            columns, values, nullable = _NIGHTLY_COLUMNS[kind]
            open_share = 0.04 if nullable else expired
            sql(
                f"INSERT INTO {spec.table} (portfolio_id, property_id, {columns})"
                f" SELECT s.portfolio_id, s.property_id, {values}"
                " FROM (SELECT x.g, mod(x.g, %(props)s) AS idx,"
                "   CASE WHEN x.h < %(expired)s THEN %(cutoff)s - interval '1 day' * (1 + 29 * x.h2)"
                "        WHEN x.h < %(open)s THEN NULL"
                "        ELSE %(slot)s - interval '1 day' * (360 * x.h2) END AS e"
                "   FROM (SELECT g, random() AS h, random() AS h2 FROM generate_series(1, %(rows)s) g) x) y"
                " JOIN bench_slots s ON s.idx = y.idx ORDER BY y.g",
                {
                    "slot": slot,
                    "cutoff": cutoff,
                    "props": n_props,
                    "expired": expired,
                    "open": open_share,
                    "rows": per_kind,
                },
            )
            sql(f"ANALYZE {spec.table}")
    # Legal holds, placed through the service (scope locks, audit events).
    step = max(1, round(1 / NIGHTLY_HELD_PROPERTIES))
    held_props = [prop for i, (prop, _) in enumerate(scope.properties) if i % step == step // 2]
    for prop in Property.objects.filter(pk__in=held_props).select_related("portfolio"):
        legal_hold_place(portfolio=prop.portfolio, property=prop, placed_by=scope.reviewer, reason="bench: litigation")
    portfolios = {po.pk: po for po in Portfolio.objects.all()}
    for kind in scope.kinds:
        spec = get_spec(kind)
        picks = sql(
            f"SELECT id, portfolio_id FROM {spec.table} WHERE {spec.timestamp_column} < %s"
            " AND NOT (property_id = ANY(%s)) ORDER BY md5(id::text) LIMIT %s",
            [cutoff, held_props, NIGHTLY_RECORD_HOLDS],
        )
        for record_id, po_id in picks:
            legal_hold_place(
                portfolio=portfolios[po_id],
                record_kind=kind,
                record_id=record_id,
                placed_by=scope.reviewer,
                reason="bench: subject access request",
            )
    sql("DROP TABLE bench_slots")
    partitioned = sql("SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'properties_tenantactivity'::regclass")
    if "tenant_activity" in scope.kinds and partitioned:
        # A night in the steady state: earlier nights dropped the empty months the
        # migration made before the first record (a first night drops them once).
        (first,) = sql(f"SELECT min(occurred_at) FROM {get_spec('tenant_activity').table}")[0]
        log(f"{table_partitions_before(first)} empty tenant-activity table partitions before {first:%Y-%m} dropped")
    for kind in scope.kinds:
        sql(f"VACUUM ANALYZE {get_spec(kind).table}")
    generate_seconds = time.perf_counter() - started
    holds = sql("SELECT count(*) FROM retention_legalhold")[0][0]
    stats = {kind: kind_stats(kind, cutoff) for kind in scope.kinds}
    return Dataset(rows, cutoff, stats, holds, generate_seconds, shape="nightly")


def table_partitions_before(first: datetime) -> int:
    """Drop the table partitions of tenant activity (the demo's monthly ones,
    migration ``properties.0006``) whose month starts before ``first``'s month: the
    caller knows they are empty. The number dropped."""
    import importlib

    migration = importlib.import_module("properties.migrations.0006_tenant_activity_table_partitions")
    start = datetime(first.year, first.month, 1, tzinfo=first.tzinfo)
    names = [
        migration.table_partition_name(year, month)
        for year, month in migration.month_starts(first)
        if datetime(year, month, 1, tzinfo=first.tzinfo) < start
    ]
    for name in names:
        sql(f"DROP TABLE IF EXISTS {name}")
    return len(names)


@contextmanager
def fk_triggers_off() -> Iterator[None]:
    """Skip the per-row foreign-key triggers while loading, when we may (superuser;
    the rows are valid by construction). The indexes stay and are built row by row,
    as in production, so their layout (and the plans the planner picks) is realistic."""
    try_sql("SET session_replication_role = replica")
    try:
        yield
    finally:
        try_sql("RESET session_replication_role")


def copy_database(source: str, target: str) -> None:
    """``target`` := a file-level copy of ``source`` on our server; Django's connections are
    closed first, since the copy drops ``target`` (and with it any connection to it)."""
    from django.db import connections

    connections.close_all()
    postgres.copy_database(os.environ["DATABASE_URL"], source, target)


def pristine_name() -> str:
    return admin_url(os.environ["DATABASE_URL"])[1] + "_bench_pristine"


def snapshot() -> float:
    """Vacuum, analyze and checkpoint, then keep a file-level copy of the whole database."""
    started = time.perf_counter()
    sql("VACUUM ANALYZE")
    try_sql("CHECKPOINT")
    url = os.environ["DATABASE_URL"]
    copy_database(admin_url(url)[1], pristine_name())
    return time.perf_counter() - started


def restore() -> float:
    """The database back to the snapshot: identical pages, statistics and visibility map
    for every run; empty pipeline and broker tables."""
    started = time.perf_counter()
    url = os.environ["DATABASE_URL"]
    copy_database(pristine_name(), admin_url(url)[1])
    try_sql("CHECKPOINT")
    return time.perf_counter() - started


def verify(ds: Dataset, label: str, *, pipeline: bool = False) -> dict[str, Any]:
    """Per kind: the same rows deleted as the predicate admits on the snapshot (count and id
    sum), and every held row past the cutoff still there. ``pipeline``: also the ledger and
    the jobs agree with what went (ledger rows_deleted and job rows_deleted per kind sum to
    the rows deleted), no job is open or dead, and no operation id is on the ledger twice."""
    from retention.eligibility import db_datetime, hold_covers_sql
    from retention.registry import get_spec

    ok = True
    deleted_total = 0
    held_total = 0
    problems = []
    for kind, k in ds.kinds.items():
        spec = get_spec(kind)
        remaining, remaining_sum = sql(f"SELECT count(*), COALESCE(sum(id), 0) FROM {k.table}")[0]
        covers, hold_params = hold_covers_sql(kind, alias="r")
        hold_sql = text(covers)
        held = sql(
            f"SELECT count(*) FROM {k.table} r WHERE r.{spec.timestamp_column} < %s AND {hold_sql}",
            [db_datetime(ds.cutoff), *hold_params],
        )[0][0]
        deleted = k.total - remaining
        deleted_total += deleted
        held_total += held
        if deleted != k.eligible or k.total_id_sum - int(remaining_sum) != k.eligible_id_sum or held != k.held:
            problems.append(
                f"{kind}: deleted {deleted} (expected {k.eligible}), id sum {k.total_id_sum - int(remaining_sum)}"
                f" (expected {k.eligible_id_sum}), held rows left {held} (expected {k.held})"
            )
        if pipeline:
            ledger = sql(
                "SELECT COALESCE(sum(rows_deleted), 0) FROM cleanup_ops_ledgerentry WHERE record_kind = %s", [kind]
            )[0][0]
            jobs = sql(
                "SELECT COALESCE(sum(rows_deleted), 0) FROM cleanup_ops_cleanupjob"
                " WHERE record_kind = %s AND job_kind = 'delete'",
                [kind],
            )[0][0]
            if int(ledger) != deleted or int(jobs) != deleted:
                problems.append(f"{kind}: ledger says {ledger} rows deleted, jobs say {jobs}, the table lost {deleted}")
    if pipeline:
        open_jobs, dead_jobs = sql(
            "SELECT count(*) FILTER (WHERE state IN ('pending', 'leased')), count(*) FILTER (WHERE state = 'dead')"
            " FROM cleanup_ops_cleanupjob"
        )[0]
        twice = sql(
            "SELECT count(*) FROM (SELECT operation_id FROM cleanup_ops_ledgerentry GROUP BY 1 HAVING count(*) > 1) d"
        )[0][0]
        if open_jobs or dead_jobs or twice:
            problems.append(f"{open_jobs} jobs open, {dead_jobs} dead, {twice} operation ids on the ledger twice")
    ok = not problems
    for problem in problems:
        log(f"VERIFY FAILED ({label}): {problem}")
    return {"deleted": deleted_total, "held_left": held_total, "ok": ok}
