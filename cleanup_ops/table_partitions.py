"""Whole table partitions dropped when no hold can be in them.

For a record kind that opts in (``"drop_table_partitions": True``,
``retention.registry``) and whose table is ``PARTITION BY RANGE`` on its
retention timestamp, a table partition whose upper bound is not after any
present portfolio's cutoff and which no active hold can reach is dropped whole
instead of deleted row by row: one ``TablePartitionDrop`` ledger row
per table partition (rows, a digest of its ids, each portfolio's policy
version and cutoff), written in the transaction of the drop. Everything else
is left to the ordinary row-delete jobs, which skip held rows: that is the
fallback, for a table partition with a hold in reach as for one not yet past
every cutoff.

Protocol — lock, then read (docs/architecture.md, "Table-partition drops").
``table_partitions_drop`` runs at the start of a sweep's trigger, before
admission, so rows it drops are never a job's candidates. Table partitions
of each kind's table with a finite upper bound (the DEFAULT one never),
oldest first. One whose upper bound lies after the largest cutoff any
approved, enabled version of the kind gives (read without a lock: a filter,
never a decision) is skipped untouched — the current months are never
locked. Each other one, in one short transaction:

a. ``SET LOCAL lock_timeout`` = ``CLEANUP_TABLE_PARTITION_LOCK_SECONDS``:
   no wait below is longer; one that would be makes the table partition
   *busy* for this night (rolled back, nothing written).
b. ``LOCK TABLE <table partition> IN SHARE MODE``. From here no row can
   enter, leave or change in it: every INSERT, UPDATE or DELETE routed to it
   takes ROW EXCLUSIVE, which conflicts. (SHARE, not ACCESS EXCLUSIVE: the
   application's reads of old rows go on during the scan of c; the drop of
   f takes ACCESS EXCLUSIVE, for milliseconds.)
   For a kind reached through a unit (a one-hop path), the units its rows
   name, ``FOR SHARE`` as a batch locks them: no unit moves into another
   property until the drop commits, so c reads where each row is for good.
c. Read, in statements after the lock: its rows per (portfolio, property),
   and ``ids_digest`` = ``encode(sha256(convert_to(coalesce(string_agg(CAST(id
   AS text), ',' ORDER BY id), ''), 'UTF8')), 'hex')`` — sha256 (hex) of its
   ids in id order joined by ``,`` (``cleanup_ops.models.table_partitions``).
d. Lock the scope rows of every row in it, in a batch's order and mode: the
   properties present, then the portfolios present, ``FOR SHARE``, in id
   order. These are the rows placing a hold takes ``FOR UPDATE`` (the
   property's for a hold naming one, else the portfolio's) and approving a
   version takes (the portfolio's). A hold placement or an approval in
   flight makes this wait (then busy); one that arrives now waits for this
   transaction, at most ``CLEANUP_SCOPE_LOCK_WAIT_SECONDS``, then either
   fails with ``ScopeBusy`` naming its scope or commits after the drop — and
   then covers nothing of this table partition, which is gone (a record hold
   on one of its records is refused: the record no longer exists). Checkpoint
   ``table_partition.after_locks``.
e. Read, in a statement after d: each present portfolio's approved version
   for the kind (cutoff = slot - retention days), and whether any active
   hold in those portfolios has record kind ``''`` or this kind, at any scope
   (portfolio, property, record: conservative, one hold puts the whole table
   partition out of reach), and whether the pipeline or a present portfolio
   (the kind's portfolios, when it is empty) is paused: a pause stops new work,
   a drop included (*kept paused*). Droppable iff nothing is paused, every present portfolio has an
   approved, *enabled* version, the upper bound is not after the smallest of
   their cutoffs, and there is no such hold. An empty table partition is
   droppable when the kind has an approved, enabled version and its upper
   bound is not after any such version's cutoff (rows 0).
f. Droppable: insert the ledger row; check that no session waits for the
   table partition's lock (an application write of an old row, a batch's
   DELETE: they hold the parent table's lock, which the drop needs, so
   going on would deadlock them — the drop steps back instead, *busy*);
   checkpoint ``table_partition.before_drop``; ``LOCK TABLE ONLY <parent> IN
   ACCESS EXCLUSIVE MODE NOWAIT`` (what the drop takes anyway; ``ONLY``: not
   every other table partition's lock too), asked again
   every few milliseconds within a's bound and never queued for
   (``_lock_parent_and_drop`` says why: queued, the drop could make the
   application's write the deadlock victim), and with it, in the same round
   trip, ``DROP TABLE <table partition>``, which detaches it as it drops it;
   commit. Every read and write of the parent waits while its lock is held:
   everything but the catalog change and the commit is done before it.
   The ledger row and the drop commit together or not at all. (Not ``ALTER
   TABLE … DETACH PARTITION`` first: a detached table partition's foreign keys
   become its own, with triggers on the portfolio and property tables, and
   dropping it then takes ACCESS EXCLUSIVE on both — every application read
   of them would wait, and a hold placement waiting for d would deadlock the
   drop. Dropped while attached, it locks the parent alone.) A deadlock (PostgreSQL ends
   one side) also rolls the drop back, *busy*. Identifiers are quoted by
   ``psycopg.sql.Identifier``.

Paced: after a table partition dropped, before the next one's transaction,
the trigger sleeps ``CLEANUP_TABLE_PARTITION_PAUSE_RATIO`` times the drop's
seconds and at least ``CLEANUP_TABLE_PARTITION_PAUSE_SECONDS``, holding no
lock; never inside a caller's transaction, whose locks would stay
(``_pacing`` says why both).

Not droppable: nothing is written. A table partition that is gone when its
turn comes (a concurrent trigger of the same slot dropped it, and wrote its
ledger row) is *already dropped*, not an error: every trigger of a slot ends
with the same one sweep.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg import sql as pgsql

from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.models import PipelinePause, TablePartitionDrop
from retention.domain import portfolio_model, property_model
from retention.eligibility import ANY_PROPERTY, HOLDS, hold_scope
from retention.models import PolicyVersion, RetentionPolicy
from retention.registry import REGISTRY, RecordKindSpec

logger = logging.getLogger(__name__)

PROPERTY = property_model()._meta.db_table
PORTFOLIO = portfolio_model()._meta.db_table
PROPERTY_PK = property_model()._meta.pk.column
PORTFOLIO_PK = portfolio_model()._meta.pk.column
POLICY = RetentionPolicy._meta.db_table
VERSION = PolicyVersion._meta.db_table

BOUND = re.compile(r"^FOR VALUES FROM \((?P<lower>.+)\) TO \((?P<upper>.+)\)$")
# lock_not_available (lock_timeout, NOWAIT), deadlock_detected: the table partition is busy tonight.
BUSY_STATES = {"55P03", "40P01"}
# undefined_table: another trigger of the same slot dropped it first (its ledger row says so).
GONE_STATES = {"42P01"}
# How often step f asks again for the parent's lock (NOWAIT) within the lock bound.
PARENT_LOCK_RETRY_SECONDS = 0.02


@dataclass(frozen=True)
class TablePartition:
    schema: str
    name: str
    lower: datetime | None  # None: MINVALUE
    upper: datetime


@dataclass
class KindReport:
    """What happened to one kind's table partitions (names; rows of the dropped)."""

    kind: str
    table: str
    dropped: dict[str, int] = field(default_factory=dict)
    kept_held: list[str] = field(default_factory=list)
    kept_young: list[str] = field(default_factory=list)  # not past every present portfolio's cutoff
    kept_no_policy: list[str] = field(default_factory=list)  # a portfolio present without an enabled version
    kept_paused: list[str] = field(default_factory=list)  # a present portfolio (or the pipeline) is paused
    already_dropped: list[str] = field(default_factory=list)  # gone when its turn came: another trigger's drop
    busy: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "dropped": len(self.dropped),
            "rows_dropped": sum(self.dropped.values()),
            "kept_held": len(self.kept_held),
            "kept_young": len(self.kept_young),
            "kept_no_policy": len(self.kept_no_policy),
            "kept_paused": len(self.kept_paused),
            "already_dropped": len(self.already_dropped),
            "busy": len(self.busy),
        }


@dataclass
class TablePartitionsReport:
    kinds: list[KindReport] = field(default_factory=list)
    skipped: str = ""  # why nothing was looked at (no kind opted in)

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "kinds": {k.kind: k.counts() for k in self.kinds}}

    def summary(self) -> str:
        if self.skipped:
            return f"table partitions: none dropped ({self.skipped})"
        parts = []
        for k in self.kinds:
            c = k.counts()
            parts.append(
                f"{k.kind}: {c['dropped']} dropped ({c['rows_dropped']} rows), {c['kept_held']} kept under a hold, "
                f"{c['kept_young']} not past every cutoff, {c['kept_no_policy']} with a portfolio without policy, "
                f"{c['kept_paused']} paused, {c['already_dropped']} already dropped, {c['busy']} busy"
            )
        return "table partitions: " + "; ".join(parts)


def _bound(text: str) -> datetime | None:
    """A range bound as pg_get_expr spells it: ``'2026-01-01 00:00:00+00'`` → UTC; MINVALUE/MAXVALUE → None."""
    text = text.strip()
    if not (text.startswith("'") and text.endswith("'")):
        return None
    value = datetime.fromisoformat(text[1:-1])
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def table_partitions_of(table: str) -> list[TablePartition]:
    """The table partitions of ``table`` with a finite upper bound, oldest first (never the DEFAULT one)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT n.nspname, c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE i.inhparent = to_regclass(%s)",
            [table],
        )
        rows = cur.fetchall()
    found = []
    for schema, name, bound in rows:
        match = BOUND.match(bound or "")
        if match is None:
            continue  # DEFAULT
        upper = _bound(match["upper"])
        if upper is None:
            continue  # MAXVALUE: never wholly past a cutoff
        found.append(TablePartition(schema=schema, name=name, lower=_bound(match["lower"]), upper=upper))
    return sorted(found, key=lambda p: p.upper)


def rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def drop_operation_id(*, kind: str, table: str, table_partition: TablePartition, slot: datetime) -> str:
    lower = rfc3339(table_partition.lower) if table_partition.lower else "-"
    upper = rfc3339(table_partition.upper)
    text = f"table_partition:{kind}:{table}:{table_partition.name}:{lower}:{upper}:{rfc3339(slot)}"
    return hashlib.sha256(text.encode()).hexdigest()


def _largest_cutoff(kind: str, slot: datetime) -> datetime | None:
    """slot - the shortest retention of any approved, enabled version of ``kind`` (None: none)."""
    days = PolicyVersion.objects.in_force().filter(policy__record_kind=kind).values_list("retention_days", flat=True)
    shortest = min(days, default=None)
    return None if shortest is None else slot - timedelta(days=shortest)


def table_partitions_drop(
    *, slot: datetime, now: datetime | None = None, sweep_id: int | None = None
) -> TablePartitionsReport:
    """Drop every droppable table partition of every opted-in kind (the module's protocol)."""
    specs = [spec for spec in REGISTRY.values() if spec.drop_table_partitions]
    if not specs:
        return TablePartitionsReport(skipped="no record kind opts in (drop_table_partitions)")
    report = TablePartitionsReport()
    owed = 0.0  # the pause the last table partition's transaction earned (pacing)
    for spec in specs:
        kind_report = KindReport(kind=spec.kind, table=spec.table)
        report.kinds.append(kind_report)
        largest = _largest_cutoff(spec.kind, slot)
        for table_partition in table_partitions_of(spec.table):
            if largest is None or table_partition.upper > largest:
                kind_report.kept_young.append(table_partition.name)
                continue
            if owed:
                _pause(owed)
            started = time.monotonic()
            verdict, rows = _drop_one(spec, table_partition, slot=slot, now=now, sweep_id=sweep_id)
            # Only a drop earns a pause: a table partition kept or busy took no
            # parent lock and changed no catalog (a busy one's seconds are waits).
            owed = _pacing(time.monotonic() - started) if verdict == "dropped" else 0.0
            if verdict == "dropped":
                kind_report.dropped[table_partition.name] = rows
            else:
                getattr(kind_report, verdict).append(table_partition.name)
    logger.info(report.summary())
    return report


def _pacing(seconds: float) -> float:
    """The pause before the next table partition: ``CLEANUP_TABLE_PARTITION_PAUSE_RATIO``
    times the drop just committed, and at least ``CLEANUP_TABLE_PARTITION_PAUSE_SECONDS``.

    Two costs, two bounds. Each drop's scan takes one of the database's cores
    and its hold makes the parent's requests wait: costs in proportion to the
    drop's seconds, so the ratio bounds them to 1 / (1 + ratio) of the time.
    And each drop's commit changes the parent's partition list, which
    invalidates every plan cached over the parent and its relation cache
    entries: every session of the table plans its next statement over it
    again, about 2.4 ms for the benchmark's probe (docs/benchmarks.md, "The
    parent's lock and the probe") — a cost per drop, whatever the drop's
    seconds, which no ratio bounds. The floor bounds the drops per second,
    so a session running n statements a second on the table pays that
    replan on at most 1 / (n * floor) of them: under 1% at 2 s for n ≥ 50.

    None inside a caller's transaction: its locks stay until that commits,
    paused or not."""
    if connection.in_atomic_block:
        return 0.0
    return max(settings.CLEANUP_TABLE_PARTITION_PAUSE_SECONDS, settings.CLEANUP_TABLE_PARTITION_PAUSE_RATIO * seconds)


def _pause(seconds: float) -> None:
    time.sleep(seconds)


class _Busy(DatabaseError):
    """Someone waits for the table partition: step back rather than deadlock them."""


def _drop_one(
    spec: RecordKindSpec, table_partition: TablePartition, *, slot: datetime, now: datetime | None, sweep_id: int | None
) -> tuple[str, int]:
    """One table partition, one transaction: ("dropped", rows) or (the reason it was kept, 0)."""
    try:
        with transaction.atomic():
            return _decide_and_drop(spec, table_partition, slot=slot, now=now, sweep_id=sweep_id)
    except _Busy as exc:
        logger.info("table partition %s busy: %s", table_partition.name, exc)
        return "busy", 0
    except DatabaseError as exc:
        state = getattr(exc.__cause__, "sqlstate", None)
        if state in BUSY_STATES:
            logger.info("table partition %s busy: %s", table_partition.name, type(exc.__cause__).__name__)
            return "busy", 0
        if state in GONE_STATES:
            # Listed, then dropped by a concurrent trigger of the same slot before
            # its lock: that trigger's transaction wrote the ledger row and dropped it.
            logger.info("table partition %s already dropped", table_partition.name)
            return "already_dropped", 0
        raise


def _decide_and_drop(
    spec: RecordKindSpec, table_partition: TablePartition, *, slot: datetime, now: datetime | None, sweep_id: int | None
) -> tuple[str, int]:
    table = pgsql.Identifier(table_partition.schema, table_partition.name)
    timeout = str(max(1, round(settings.CLEANUP_TABLE_PARTITION_LOCK_SECONDS * 1000)))
    # Listed, not yet locked: a concurrent trigger of the slot may drop it now.
    checkpoint("table_partition.before_lock")
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, true)", [timeout])  # a
        # Deferred foreign-key checks still pending on its rows (rows a caller
        # wrote earlier in its own transaction) would make the DROP refuse: run them now.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(pgsql.SQL("LOCK TABLE {table} IN SHARE MODE").format(table=table))  # b
        hop = spec.path_hop
        if hop is not None:
            # b': a kind reached through its unit: the units its rows name,
            # FOR SHARE, before c reads their properties (lock, then read: a
            # unit moving into a held property meanwhile waits for the drop).
            unit, unit_pk, _ = hop
            cur.execute(
                pgsql.SQL(
                    "SELECT u.{unit_pk} FROM {unit} u WHERE u.{unit_pk} IN (SELECT t.{unit_column} FROM {target} t)"
                    " ORDER BY u.{unit_pk} FOR SHARE OF u"
                ).format(
                    unit=pgsql.Identifier(unit),
                    unit_pk=pgsql.Identifier(unit_pk),
                    unit_column=pgsql.Identifier(spec.property_column),
                    target=table,
                )
            )
        # c: read after the lock.
        cur.execute(
            pgsql.SQL("SELECT t.{portfolio}, {property}, count(*) FROM {table} t GROUP BY 1, 2 ORDER BY 1, 2").format(
                portfolio=pgsql.Identifier(spec.portfolio_column),
                property=spec.property_of("t"),  # the registry's fragment: the property through its path
                table=table,
            )
        )
        present = cur.fetchall()
        cur.execute(
            pgsql.SQL(
                """
                SELECT count(*),
                    encode(sha256(convert_to(coalesce(string_agg(CAST(t.{pk} AS text), ',' ORDER BY t.{pk}), ''),
                        'UTF8')), 'hex')
                FROM {table} t
                """
            ).format(pk=pgsql.Identifier(spec.pk_column), table=table)
        )
        rows, digest = cur.fetchone()
        # The keys as the database gives them: an int, a UUID, a str (the host's key types).
        portfolios = sorted({p for p, _, _ in present})
        properties = sorted({q for _, q, _ in present if q is not None})
        # d: the scope rows, as a batch takes them.
        if properties:
            cur.execute(
                pgsql.SQL("SELECT {pk} FROM {property} WHERE {pk} = ANY(%s) ORDER BY {pk} FOR SHARE").format(
                    pk=pgsql.Identifier(PROPERTY_PK), property=pgsql.Identifier(PROPERTY)
                ),
                [properties],
            )
        if portfolios:
            cur.execute(
                pgsql.SQL("SELECT {pk} FROM {portfolio} WHERE {pk} = ANY(%s) ORDER BY {pk} FOR SHARE").format(
                    pk=pgsql.Identifier(PORTFOLIO_PK), portfolio=pgsql.Identifier(PORTFOLIO)
                ),
                [portfolios],
            )
        checkpoint("table_partition.after_locks")
        # e: the decision, read after every lock it depends on.
        cur.execute(
            pgsql.SQL(
                """
                SELECT rp.portfolio_id, v.id, v.retention_days, v.enabled FROM {policy} rp
                JOIN {version} v ON v.policy_id = rp.id AND v.status = %s
                WHERE rp.record_kind = %s AND (rp.portfolio_id = ANY(%s) OR %s)
                """
            ).format(policy=pgsql.Identifier(POLICY), version=pgsql.Identifier(VERSION)),
            [PolicyVersion.Status.APPROVED, spec.kind, portfolios, not portfolios],
        )
        versions = {p: (int(v), int(days), bool(enabled)) for p, v, days, enabled in cur.fetchall()}
        # Pauses stop new work: a drop is work of the portfolios present (of the
        # kind's, when empty), as a lease is its job's portfolio's (jobs.unpaused_q).
        if _paused(portfolios or list(versions)):
            return "kept_paused", 0
        held = bool(portfolios) and portfolios_held(cur, spec=spec, portfolios=portfolios)
        verdict = _verdict(table_partition, portfolios=portfolios, versions=versions, held=held, slot=slot)
        if verdict != "dropped":
            return verdict, 0
        counts = dict.fromkeys(portfolios, 0)
        for p, _, n in present:
            counts[p] += int(n)
        TablePartitionDrop.objects.create(
            operation_id=drop_operation_id(
                kind=spec.kind, table=spec.table, table_partition=table_partition, slot=slot
            ),
            sweep_id=sweep_id,
            record_kind=spec.kind,
            table=spec.table,
            table_partition=table_partition.name,
            lower_bound=table_partition.lower,
            upper_bound=table_partition.upper,
            rows=int(rows),
            ids_digest=str(digest),
            portfolios={
                str(p): {
                    "rows": counts[p],
                    "policy_version_id": versions[p][0],
                    "cutoff": rfc3339(slot - timedelta(days=versions[p][1])),
                }
                for p in portfolios
            },
            slot=slot,
            dropped_at=now or timezone.now(),
        )
        # f: a session waiting for this table partition holds the parent's
        # lock the drop needs: going on would deadlock it.
        cur.execute(
            # pg_locks is the cluster's: another database's relation may have the same oid
            # (databases copied from one template do), so this database's locks only.
            "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND relation = to_regclass(%s) AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [f"{table_partition.schema}.{table_partition.name}"],
        )
        if cur.fetchone()[0]:
            raise _Busy(f"a session waits for table partition {table_partition.name}")
        checkpoint("table_partition.before_drop")
        _lock_parent_and_drop(cur, spec.table, table_partition)
    return "dropped", int(rows)


def portfolios_held(cur: Any, *, spec: RecordKindSpec, portfolios: list[Any]) -> bool:
    """Does an active hold in ``portfolios`` reach ``spec``'s records, at any
    scope — portfolio, property or record (conservative: a month of every
    property and record goes at once)? The hold rule's one text
    (``eligibility.hold_scope``), for every property of them."""
    scope = hold_scope(spec, portfolio=pgsql.SQL("ANY(%s)"), property=ANY_PROPERTY, kind=pgsql.Placeholder())
    held = pgsql.SQL("SELECT EXISTS (SELECT 1 FROM {h} h WHERE {scope})").format(h=HOLDS, scope=scope)
    cur.execute(held, [portfolios, spec.kind])
    return bool(cur.fetchone()[0])


def _paused(portfolios: list[Any]) -> bool:
    """An active pause of the pipeline or of one of ``portfolios`` (read after the locks)."""
    return PipelinePause.objects.active().filter(Q(portfolio_id__isnull=True) | Q(portfolio_id__in=portfolios)).exists()


def _lock_parent_and_drop(cur: Any, table: str, table_partition: TablePartition) -> None:
    """The parent's ACCESS EXCLUSIVE lock, asked for with NOWAIT, and the
    ``DROP TABLE`` in the same round trip; asked again every
    ``PARENT_LOCK_RETRY_SECONDS`` within ``CLEANUP_TABLE_PARTITION_LOCK_SECONDS``,
    each try in a savepoint; never granted in that time: busy.

    Why never wait in the lock's queue: a session that writes an old row
    holds the parent's ROW EXCLUSIVE lock and waits for this table
    partition's (ours, SHARE). Queued behind it, the drop would close a cycle
    that PostgreSQL breaks by ending whichever side's deadlock check runs
    first — the application's write, if it began waiting less than
    ``deadlock_timeout`` before. A queued ACCESS EXCLUSIVE request also makes
    every later reader of the parent wait behind it. Never queued, the drop
    holds the lock only for the catalog change; the application's write
    waits for our rollback at most and always lands.

    Why one round trip: every reader and writer of the parent waits while the
    lock is held, and the lock is held until the commit's end. Sent together,
    the ``DROP TABLE`` runs as the lock is granted (a refused NOWAIT ends the
    string there: the ``DROP`` never runs without the lock), and the savepoint
    of the try that succeeded is left to the commit to release — from the
    grant to the commit's end, the drop's catalog change, one answer and the
    ``COMMIT``, nothing more.

    ``DROP TABLE`` detaches it too. Not ``ALTER TABLE … DETACH PARTITION``
    first: that makes its inherited foreign keys its own, with triggers on
    the portfolio and property tables, which the ``DROP`` then takes ACCESS
    EXCLUSIVE (every reader of them waits; a hold placement waiting for our
    scope lock deadlocks us). Dropped attached, only the parent is locked.

    ``ONLY``: without it ``LOCK TABLE`` takes every table partition's lock too
    (~180 here), which the drop does not need (every query of the table locks
    the parent first) and which a session holding any of them refuses — an
    autovacuum of this month's table partition, a direct read of one — so the
    night's drops would be busy for as long as autovacuum works anywhere in
    the table."""
    statement = pgsql.SQL(
        """
        LOCK TABLE ONLY {parent} IN ACCESS EXCLUSIVE MODE NOWAIT;
        DROP TABLE {table_partition}
        """
    ).format(
        parent=pgsql.Identifier(table),
        table_partition=pgsql.Identifier(table_partition.schema, table_partition.name),
    )
    deadline = time.monotonic() + settings.CLEANUP_TABLE_PARTITION_LOCK_SECONDS
    while True:
        savepoint = transaction.savepoint()
        try:
            cur.execute(statement)  # no parameters: both statements in one simple query
            return
        except OperationalError as exc:
            transaction.savepoint_rollback(savepoint)
            if getattr(exc.__cause__, "sqlstate", None) != "55P03" or time.monotonic() >= deadline:
                raise
        time.sleep(PARENT_LOCK_RETRY_SECONDS)


def _verdict(
    table_partition: TablePartition,
    *,
    portfolios: list[Any],
    versions: dict[Any, tuple[int, int, bool]],
    held: bool,
    slot: datetime,
) -> str:
    """``dropped``, or why not: ``kept_held``, ``kept_no_policy``, ``kept_young`` (step e)."""
    if held:
        return "kept_held"
    if portfolios:
        if any(p not in versions or not versions[p][2] for p in portfolios):
            return "kept_no_policy"
        cutoffs = [slot - timedelta(days=versions[p][1]) for p in portfolios]
    else:
        # Empty: every enabled version of the kind must be past it.
        cutoffs = [slot - timedelta(days=days) for _, days, enabled in versions.values() if enabled]
        if not cutoffs:
            return "kept_no_policy"
    return "dropped" if table_partition.upper <= min(cutoffs) else "kept_young"
