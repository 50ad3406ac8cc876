"""Why the batch statements cost what they cost (``--only plans``): on a fresh copy of the
dataset, after admission, the statements of one 100-partition group transaction are
timed in isolation, each in a transaction that is rolled back, median of ``REPEAT``:

* **round trip**: ``SELECT 1`` (the floor of any statement);
* **candidates**: the group candidate query (``sql.group_candidates``, keyset index
  ``(property, id)``) against the same rows found through the due index
  ``(property, timestamp, id)`` (an ``OFFSET 0`` subquery, then sorted by id): the first
  walks every row of a partition up to the limit, the second only the expired ones;
  in the nightly shape ~1 row in 100 is expired. Both return the same counts (checked);
* **ledger insert**: ``sql.ledger_insert_many(100)`` (1,300 parameters) against the same
  100 rows passed as 13 arrays through ``unnest`` (13 parameters), client time and
  server time (``EXPLAIN ANALYZE``), to tell parameter handling from the insert itself;
* **job update**: the group's finishing ``UPDATE`` of 100 job rows (``state`` changes:
  every index of the job table gets a new entry) against an update of the same rows
  that changes no indexed column (a HOT update), server time.

Internals of ``cleanup_ops`` are used by name; a statement that no longer exists is
reported as skipped.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import log, sql

REPEAT = 15
GROUP = 100


def _median_ms(fn: Any, repeat: int = REPEAT) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return round(1000 * statistics.median(samples), 3)


def _rolled_back(statement: str, params: list[Any]) -> Any:
    """Run one statement in a transaction that is rolled back; returns its rows."""
    from django.db import connection, transaction

    rows: list[Any] = []

    class _Undo(Exception):
        pass

    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, params)
            rows = cur.fetchall() if cur.description else []
            raise _Undo
    except _Undo:
        pass
    return rows


def _explain_ms(statement: str, params: list[Any]) -> tuple[float, float]:
    """(planning ms, execution ms) of EXPLAIN ANALYZE, rolled back."""
    rows = _rolled_back("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
    plan = rows[0][0]
    if isinstance(plan, str):
        import json

        plan = json.loads(plan)
    return float(plan[0]["Planning Time"]), float(plan[0]["Execution Time"])


def _explain_text(statement: str, params: list[Any]) -> list[str]:
    rows = _rolled_back("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + statement, params)
    return [r[0] for r in rows]


def plans_phase(slot: datetime, group: int = GROUP) -> dict[str, Any]:
    from django.conf import settings

    from cleanup_ops import sql as pipeline_sql
    from cleanup_ops.models import CleanupJob
    from cleanup_ops.schedule import sweep_trigger
    from retention.eligibility import db_datetime
    from retention.registry import get_spec

    settings.Q_CLUSTER["sync"] = True  # admission's dispatch: off (nothing runs the jobs)
    sweep_trigger(slot=slot)
    settings.Q_CLUSTER["sync"] = False
    jobs = list(
        CleanupJob.objects.filter(kind="delete")
        .order_by("available_at", "id")
        .values_list("id", "portfolio_id", "property_id", "record_kind", "cutoff")[:group]
    )
    out: dict[str, Any] = {"group": len(jobs)}
    out["round_trip_ms"] = _median_ms(lambda: sql("SELECT 1"))

    # Candidates, one record kind's share of the group (as _count_candidates runs it).
    kind = max({j[3] for j in jobs}, key=lambda k: sum(1 for j in jobs if j[3] == k))
    items = [j for j in jobs if j[3] == kind]
    spec = get_spec(kind)
    try:
        keyset = pipeline_sql.group_candidates(
            table=spec.table, timestamp_column=spec.timestamp_column, jobs=len(items)
        )
    except (AttributeError, TypeError) as exc:
        keyset = None
        out["candidates"] = f"skipped ({type(exc).__name__})"
    if keyset:
        # The statement's own parameter layout: (job, property, after, cutoff) per partition
        # and the limit, or (ord, job, property, after, cutoff) and the per-partition and
        # global limits (3a3464e).
        per_row = 5 if keyset.count("%s") == 5 * len(items) + 2 else 4
        full: list[Any] = []
        for ord_, (job_id, _po, prop, _k, cutoff) in enumerate(items):
            full += ([ord_] if per_row == 5 else []) + [job_id, prop, 0, db_datetime(cutoff)]
        full += [1000, 1001] if per_row == 5 else [1000]
        rows = pipeline_sql.values_list(len(items), ["bigint", "bigint", "bigint", "timestamptz"])
        ts = spec.timestamp_column
        due = (
            f"WITH g(job_id, property_id, after_id, cutoff) AS (VALUES {rows})"
            f" SELECT g.job_id, COUNT(c.id), MAX(c.id) FROM g LEFT JOIN LATERAL ("
            f"SELECT d.id FROM (SELECT r.id FROM {spec.table} r WHERE r.property_id = g.property_id"
            f" AND r.{ts} < g.cutoff AND r.id > g.after_id OFFSET 0) d ORDER BY d.id LIMIT %s) c ON true"
            " GROUP BY g.job_id"
        )
        due_params: list[Any] = []
        for job_id, _po, prop, _k, cutoff in items:
            due_params += [job_id, prop, 0, db_datetime(cutoff)]
        due_params.append(1000)

        def by_job(result: list[Any]) -> dict[int, tuple[int, Any]]:
            # (…, job id, [rows,] candidates, last id): the job id is 3rd or 4th from the end.
            return {int(r[-4] if len(r) >= 5 else r[-3]): (int(r[-2]), r[-1]) for r in result}

        found_rows = by_job(_rolled_back(keyset, full))
        same = found_rows == by_job(_rolled_back(due, due_params))
        out["candidates"] = {
            "kind": kind,
            "partitions": len(items),
            "keyset_index": _explain_ms(keyset, full),
            "due_index": _explain_ms(due, due_params),
            "keyset_client_ms": _median_ms(lambda: _rolled_back(keyset, full)),
            "due_client_ms": _median_ms(lambda: _rolled_back(due, due_params)),
            "same_result": same,
            "keyset_plan": _explain_text(keyset, full)[:26],
        }
        # The group DELETE over the same partitions' candidate ranges.
        try:
            from retention.eligibility import eligible_sql_for

            found = {job_id: last for job_id, (_n, last) in found_rows.items()}
            live = [(job_id, prop, cutoff) for job_id, _po, prop, _k, cutoff in items if found.get(job_id)]
            predicate, predicate_params = eligible_sql_for(kind, cutoff_sql="g.cutoff", alias=spec.table)
            statement = pipeline_sql.group_delete(table=spec.table, predicate=predicate, jobs=len(live), returning=None)
            delete_params: list[Any] = []
            for job_id, prop, cutoff in live:
                delete_params += [prop, 0, found[job_id], db_datetime(cutoff)]
            delete_params += predicate_params
            out["delete"] = {
                "partitions": len(live),
                "server": _explain_ms(statement, delete_params),
                "client_ms": _median_ms(lambda: _rolled_back(statement, delete_params), repeat=5),
                "plan": _explain_text(statement, delete_params)[:26],
            }
        except (AttributeError, TypeError, ImportError) as exc:
            out["delete"] = f"skipped ({type(exc).__name__})"

    # Ledger insert: 1,300 scalar parameters against 13 arrays.
    now = datetime.now(UTC)
    ledger_rows = [
        [
            f"bench-plan-{job_id}-{time.monotonic_ns()}",
            job_id,
            po,
            prop,
            k,
            None,
            db_datetime(cutoff),
            0,
            1,
            1000,
            1,
            1,
            db_datetime(now),
        ]
        for job_id, po, prop, k, cutoff in jobs
    ]
    versions = dict(
        sql(
            "SELECT id, policy_version_id FROM cleanup_ops_cleanupjob WHERE id = ANY(%s)",
            [[j[0] for j in jobs]],
        )
    )
    for row in ledger_rows:
        row[5] = versions[row[1]]
    try:
        scalar = pipeline_sql.ledger_insert_many(len(ledger_rows))
    except (AttributeError, TypeError) as exc:
        scalar = None
        out["ledger_insert"] = f"skipped ({type(exc).__name__})"
    if scalar:
        flat = [v for row in ledger_rows for v in row]
        columns = list(zip(*ledger_rows, strict=True))
        types = [
            "text",
            "bigint",
            "bigint",
            "bigint",
            "text",
            "bigint",
            "timestamptz",
            "bigint",
            "bigint",
            "integer",
            "integer",
            "integer",
            "timestamptz",
        ]
        arrays = (
            "INSERT INTO cleanup_ops_ledgerentry (operation_id, job_id, portfolio_id, property_id, record_kind,"
            " policy_version_id, cutoff, after_id, last_id, batch_limit, candidates, rows_deleted, applied_at)"
            " SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in types) + ")"
        )
        array_params = [list(c) for c in columns]
        out["ledger_insert"] = {
            "rows": len(ledger_rows),
            "scalar_params": len(flat),
            "scalar_client_ms": _median_ms(lambda: _rolled_back(scalar, flat)),
            "scalar_server_ms": _explain_ms(scalar, flat),
            "arrays_client_ms": _median_ms(lambda: _rolled_back(arrays, array_params)),
            "arrays_server_ms": _explain_ms(arrays, array_params),
        }

    # The finishing job update (state leased -> done: not HOT) against a HOT update.
    try:
        advance = pipeline_sql.group_jobs_advance(len(jobs))
    except (AttributeError, TypeError) as exc:
        advance = None
        out["job_update"] = f"skipped ({type(exc).__name__})"
    if advance:
        adv_params: list[Any] = []
        for job_id, *_ in jobs:
            adv_params += [job_id, 1, 1, 1, 0, 1, ""]
        adv_params += [db_datetime(now), db_datetime(now + timedelta(seconds=60))]
        ids = [j[0] for j in jobs]
        hot = (
            "UPDATE cleanup_ops_cleanupjob SET batches = batches + 1, rows_deleted = rows_deleted + 1"
            " WHERE id = ANY(%s)"
        )
        out["job_update"] = {
            "rows": len(jobs),
            "indexes": sql("SELECT count(*) FROM pg_indexes WHERE tablename = 'cleanup_ops_cleanupjob'")[0][0],
            "finish_server_ms": _explain_ms(advance, adv_params),
            "finish_client_ms": _median_ms(lambda: _rolled_back(advance, adv_params)),
            "hot_server_ms": _explain_ms(hot, [ids]),
            "hot_client_ms": _median_ms(lambda: _rolled_back(hot, [ids])),
        }
    log(f"plans: {out.get('candidates', {}) if isinstance(out.get('candidates'), str) else 'done'}")
    return out
