"""The benchmark's dataset: 100 portfolios (one big), their properties and policies, the
generated leases and legal holds, the file-level snapshot every run starts from, and the
check that a run deleted exactly the eligible rows."""

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

from bench.common import log, sql, try_sql
from harness import postgres
from harness.postgres import admin_url

KIND = "lease"
TABLE = "properties_lease"
RETENTION_DAYS = 365
BIG_PROPERTIES = 10  # the big portfolio: half of all rows over this many properties
SMALL_PORTFOLIOS = 99
SMALL_PROPERTIES = 3  # properties per small portfolio
HELD_SMALL_PORTFOLIOS = (10, 25, 40, 55, 70, 85)  # first property of each gets a property-level hold
RECORD_HOLDS = 40  # record-level holds: half in the big portfolio, half spread over small ones


def cleanup_tables() -> str:
    """Every pipeline table (sweeps, jobs, ledger, dead letters, buckets, pauses…) and the broker's."""
    from django.db import connection

    names = [t for t in connection.introspection.table_names() if t.startswith("cleanup_ops_")]
    return ", ".join([*sorted(names), "django_q_ormq", "django_q_task"])


@dataclass
class Scope:
    big_portfolio: int
    properties: list[tuple[int, int]]  # (property id, portfolio id), big portfolio first
    manager: Any
    reviewer: Any


@dataclass
class Dataset:
    rows: int
    cutoff: datetime
    eligible: int
    eligible_id_sum: int
    held: int
    total: int
    total_id_sum: int
    holds: int
    generate_seconds: float


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
        policy_version_approve(version_id=version.pk, reviewer=reviewer, note="benchmark")
    return Scope(portfolios[0].pk, [(p.pk, p.portfolio_id) for p in props], manager, reviewer)


def load_records(scope: Scope, rows: int, slot: datetime) -> Dataset:
    """``rows`` leases, ~96% past the cutoff, ~1% held; snapshot into the pristine copy."""
    from properties.models import Portfolio, Property
    from retention.eligibility import db_datetime, eligible_sql, hold_covers_sql
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
            f"INSERT INTO {TABLE} (portfolio_id, property_id, unit, tenant_name, started_on, ended_on)"
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

    pred, params = eligible_sql(KIND, cutoff=cutoff, alias="r")
    eligible, eligible_sum = sql(f"SELECT count(*), COALESCE(sum(r.id), 0) FROM {TABLE} r WHERE {pred}", params)[0]
    hold_sql, hold_params = hold_covers_sql(KIND, alias="r")
    held = sql(
        f"SELECT count(*) FROM {TABLE} r WHERE r.ended_on < %s AND {hold_sql}", [db_datetime(cutoff), *hold_params]
    )[0][0]
    total, total_sum = sql(f"SELECT count(*), COALESCE(sum(id), 0) FROM {TABLE}")[0]
    holds = sql("SELECT count(*) FROM retention_legalhold")[0][0]
    return Dataset(rows, cutoff, eligible, int(eligible_sum), held, total, int(total_sum), holds, generate_seconds)


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


def verify(ds: Dataset, label: str) -> dict[str, Any]:
    """Same rows deleted as the predicate admits (count and id sum); held rows all remain."""
    from retention.eligibility import db_datetime, hold_covers_sql

    remaining, remaining_sum = sql(f"SELECT count(*), COALESCE(sum(id), 0) FROM {TABLE}")[0]
    hold_sql, hold_params = hold_covers_sql(KIND, alias="r")
    held = sql(
        f"SELECT count(*) FROM {TABLE} r WHERE r.ended_on < %s AND {hold_sql}", [db_datetime(ds.cutoff), *hold_params]
    )[0][0]
    deleted = ds.total - remaining
    ok = deleted == ds.eligible and ds.total_id_sum - int(remaining_sum) == ds.eligible_id_sum and held == ds.held
    if not ok:
        log(
            f"VERIFY FAILED ({label}): deleted {deleted} (expected {ds.eligible}),"
            f" id sum {ds.total_id_sum - int(remaining_sum)} (expected {ds.eligible_id_sum}),"
            f" held rows left {held} (expected {ds.held})"
        )
    return {"deleted": deleted, "held_left": held, "ok": ok}
