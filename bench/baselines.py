"""The runs the pipeline is measured against, each on a fresh copy of the dataset and verified:

* ``run_loop``: the design the product replaces, one process running ``DELETE … LIMIT``
  in a loop, one transaction per statement (a keyset loop per property for the
  backlog shape, per portfolio and record kind for the nightly one);
* ``run_single_delete``: the database's ceiling, one ``DELETE`` per kind;
* ``run_loop_ranged``: the loop with ``run_batch``'s two data statements and nothing
  else, so that its difference to ``cleanup_drain`` is the protocol's cost.

They run in this process, on Django's connection. Apart from ``bench/runs.py`` (the
pipeline's own runs, whose server-side counts and ``RunResult`` they share) because
they measure no product code.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from bench.common import sql, text
from bench.dataset import KIND, RETENTION_DAYS, TABLE, Dataset, verify
from bench.runs import RunResult, ServerCount, small_portfolio_fairness


def run_loop(ds: Dataset, batch: int, slot: datetime) -> RunResult:
    """The design the product replaces: one process, one transaction per ``DELETE … LIMIT``.
    Backlog shape: a keyset loop per property (leases). Nightly shape: per portfolio and
    record kind, ``DELETE … WHERE id IN (SELECT … LIMIT batch)`` until a short batch."""
    if ds.shape == "nightly":
        return _run_loop_portfolios(ds, batch, slot)
    from django.db import connection

    from retention.eligibility import eligible_sql

    props = _loop_properties()
    batches = 0
    deleted = 0
    finished: dict[int, float] = {}
    server = ServerCount()
    server.begin()
    epoch = time.time()
    started = time.perf_counter()
    with connection.cursor() as cur:  # autocommit: every statement is its own transaction
        for prop_id, days in props:
            predicate, params = eligible_sql(KIND, cutoff=slot - timedelta(days=days), alias="r")
            pred = text(predicate)
            after = 0
            while True:
                cur.execute(
                    f"WITH d AS (DELETE FROM {TABLE} WHERE id IN (SELECT r.id FROM {TABLE} r"
                    f" WHERE r.property_id = %s AND r.id > %s AND {pred} ORDER BY r.property_id, r.id LIMIT %s)"
                    " RETURNING id) SELECT count(*), max(id) FROM d",
                    [prop_id, after, *params, batch],
                )
                n, last = cur.fetchone()
                batches += 1
                deleted += n
                if n < batch:
                    break
                after = last
            finished[prop_id] = time.perf_counter() - started
    seconds = time.perf_counter() - started
    window = (epoch, epoch + seconds)
    server.end()
    check = verify(ds, "loop")
    extra = {"batches": batches, "statements": batches, **small_portfolio_fairness(finished, seconds)}
    return RunResult(
        "DELETE loop (1 process)", seconds, check["deleted"], check["ok"], extra=server.into(extra), window=window
    )


def _run_loop_portfolios(ds: Dataset, batch: int, slot: datetime) -> RunResult:
    from django.db import connection

    from retention.eligibility import eligible_sql
    from retention.registry import get_spec

    units = sql(
        "SELECT rp.portfolio_id, rp.record_kind, v.retention_days FROM retention_retentionpolicy rp"
        " JOIN retention_policyversion v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled"
        " ORDER BY rp.portfolio_id, rp.record_kind"
    )
    batches = deleted = 0
    server = ServerCount()
    server.begin()
    started = time.perf_counter()
    with connection.cursor() as cur:  # autocommit: every statement is its own transaction
        for portfolio_id, kind, days in units:
            table = get_spec(kind).table
            predicate, params = eligible_sql(kind, cutoff=slot - timedelta(days=days), alias="r")
            pred = text(predicate)
            while True:
                cur.execute(
                    f"WITH d AS (DELETE FROM {table} WHERE id IN (SELECT r.id FROM {table} r"
                    f" WHERE r.portfolio_id = %s AND {pred} ORDER BY r.id LIMIT %s) RETURNING id)"
                    " SELECT count(*) FROM d",
                    [portfolio_id, *params, batch],
                )
                (n,) = cur.fetchone()
                batches += 1
                deleted += n
                if n < batch:
                    break
    seconds = time.perf_counter() - started
    server.end()
    check = verify(ds, "loop")
    extra = {"batches": batches, "statements": batches, "units": len(units)}
    return RunResult("DELETE loop (1 process)", seconds, check["deleted"], check["ok"], extra=server.into(extra))


def run_single_delete(ds: Dataset, slot: datetime) -> RunResult:
    """The database's ceiling: one DELETE statement with the whole predicate, one transaction."""
    from django.db import connection

    from retention.eligibility import eligible_sql

    server = ServerCount()
    server.begin()
    started = time.perf_counter()
    with connection.cursor() as cur:
        for kind, stats in ds.kinds.items():
            predicate, params = eligible_sql(kind, cutoff=slot - timedelta(days=RETENTION_DAYS), alias=stats.table)
            pred = text(predicate)
            cur.execute(f"DELETE FROM {stats.table} WHERE {pred}", params)
    seconds = time.perf_counter() - started
    server.end()
    check = verify(ds, "one DELETE")
    label = "one DELETE statement (ceiling)" if len(ds.kinds) == 1 else "one DELETE per kind (ceiling)"
    extra = {"statements": len(ds.kinds)}
    return RunResult(label, seconds, check["deleted"], check["ok"], extra=server.into(extra))


def run_loop_ranged(ds: Dataset, batch: int, slot: datetime) -> RunResult:
    """The loop with run_batch's two data statements and nothing else: the next ``batch``
    expired ids after the cursor (index-only), then a ranged DELETE with the predicate.
    The difference to ``cleanup_drain`` is the protocol (leases, locks, ledger, jobs)."""
    from django.db import connection

    from retention.eligibility import db_datetime, eligible_sql

    props = _loop_properties()
    batches = 0
    deleted = 0
    select_seconds = delete_seconds = 0.0
    server = ServerCount()
    server.begin()
    started = time.perf_counter()
    with connection.cursor() as cur:
        for prop_id, days in props:
            cutoff = slot - timedelta(days=days)
            predicate, params = eligible_sql(KIND, cutoff=cutoff, alias=TABLE)
            pred = text(predicate)
            after = 0
            while True:
                t0 = time.perf_counter()
                cur.execute(
                    f"SELECT COUNT(*), MAX(c.id) FROM (SELECT r.id FROM {TABLE} r WHERE r.property_id = %s"
                    " AND r.id > %s AND r.ended_at < %s ORDER BY r.property_id, r.id LIMIT %s) c",
                    [prop_id, after, db_datetime(cutoff), batch],
                )
                candidates, last = cur.fetchone()
                t1 = time.perf_counter()
                select_seconds += t1 - t0
                if not candidates:
                    break
                cur.execute(
                    f"DELETE FROM {TABLE} WHERE {TABLE}.property_id = %s AND {TABLE}.id > %s AND {TABLE}.id <= %s"
                    f" AND {pred}",
                    [prop_id, after, last, *params],
                )
                delete_seconds += time.perf_counter() - t1
                batches += 1
                deleted += cur.rowcount
                if candidates < batch:
                    break
                after = last
    seconds = time.perf_counter() - started
    server.end()
    check = verify(ds, "loop, ranged")
    extra = {
        "batches": batches,
        "candidates_ms_per_batch": round(1000 * select_seconds / max(batches, 1), 2),
        "delete_ms_per_batch": round(1000 * delete_seconds / max(batches, 1), 2),
    }
    return RunResult(
        "DELETE loop, run_batch's 2 statements", seconds, check["deleted"], check["ok"], extra=server.into(extra)
    )


def _loop_properties() -> list[tuple[int, int]]:
    """(property id, retention days of its portfolio's active policy) in property order."""
    return sql(
        "SELECT p.id, v.retention_days FROM properties_property p"
        " JOIN retention_retentionpolicy rp ON rp.portfolio_id = p.portfolio_id AND rp.record_kind = %s"
        " JOIN retention_policyversion v ON v.policy_id = rp.id AND v.status = 'approved' AND v.enabled"
        " ORDER BY p.id",
        [KIND],
    )
