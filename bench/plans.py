"""Why the batch statements cost what they cost (``--only plans``): on a fresh copy of the
dataset, after admission, the statements of one 100-partition group transaction are
timed in isolation, each in a transaction that is rolled back, median of ``REPEAT``:

* **round trip**: ``SELECT 1`` (the floor of any statement);
* **candidates**: the group candidate query as ``execution.candidates`` runs it
  (``execution.statements.group_candidates``, named parameters, the partitions a ``g`` of arrays through
  ``unnest``, keyset index ``(property, id)``) against the same statement (same ``g``,
  same parameters) finding the rows through the due index ``(property, timestamp, id)``
  (an ``OFFSET 0`` subquery, then sorted by id): the first walks every row of a
  partition up to the limit, the second only the expired ones; in the nightly shape ~1
  row in 100 is expired. Both return the same counts (checked);
* **delete**: ``execution.statements.group_delete`` over those partitions' candidate ranges, as
  ``execution.candidates`` runs it (``DELETE_COLUMNS`` arrays, the eligibility predicate its own);
* **ledger insert**: the ledger CTE of ``execution.statements.ledger_insert_and_jobs_advance`` for
  100 rows (13 arrays through ``unnest``, the committed form) against the same 100 rows as a
  ``VALUES`` list of 1,300 scalar parameters (built here), client time and server time (``EXPLAIN ANALYZE``), to tell
  parameter handling from the insert itself;
* **job update**: the group's finishing ``execution.statements.group_jobs_advance`` of 100 job rows
  (``state`` 'done', outcome 'deleted': every index of the job table gets a new entry)
  against an update of the same rows that changes no indexed column (a HOT update).

Internals of ``cleanup_ops`` are used by name; a statement that no longer exists is
reported as skipped.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql as pg

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


# A statement as the product builds it (composed) or a bench's own literal text.
Statement = str | pg.Composable


def _composable(statement: Statement) -> pg.Composable:
    return pg.SQL(statement) if isinstance(statement, str) else statement  # type: ignore[arg-type]  # a literal


def _rolled_back(statement: Statement, params: list[Any] | dict[str, Any]) -> Any:
    """Run one statement (positional or named parameters) in a transaction that is rolled
    back; returns its rows."""
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


def _explain_ms(statement: Statement, params: list[Any] | dict[str, Any]) -> tuple[float, float]:
    """(planning ms, execution ms) of EXPLAIN ANALYZE, rolled back."""
    rows = _rolled_back(pg.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(_composable(statement)), params)
    plan = rows[0][0]
    if isinstance(plan, str):
        import json

        plan = json.loads(plan)
    return float(plan[0]["Planning Time"]), float(plan[0]["Execution Time"])


def _explain_text(statement: Statement, params: list[Any] | dict[str, Any]) -> list[str]:
    rows = _rolled_back(
        pg.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {}").format(_composable(statement)), params
    )
    return [r[0] for r in rows]


def plans_phase(slot: datetime, group: int = GROUP) -> dict[str, Any]:
    from django.conf import settings

    from cleanup_ops import sql as pipeline_sql
    from cleanup_ops.execution import statements
    from cleanup_ops.lifecycle import JobOutcome, JobState
    from cleanup_ops.models import CleanupJob
    from cleanup_ops.schedule import sweep_trigger
    from retention.eligibility import db_datetime
    from retention.registry import get_spec

    settings.Q_CLUSTER["sync"] = True  # admission's dispatch: off (nothing runs the jobs)
    sweep_trigger(slot=slot)
    settings.Q_CLUSTER["sync"] = False
    jobs = list(
        CleanupJob.objects.filter(job_kind="delete")
        .order_by("available_at", "id")
        .values_list("id", "portfolio_id", "property_id", "record_kind", "cutoff")[:group]
    )
    out: dict[str, Any] = {"group": len(jobs)}
    out["round_trip_ms"] = _median_ms(lambda: sql("SELECT 1"))

    # Candidates, one record kind's share of the group (as _count_candidates runs it:
    # per-partition limit 1000, global limit budget + 1).
    kind = max({j[3] for j in jobs}, key=lambda k: sum(1 for j in jobs if j[3] == k))
    items = [j for j in jobs if j[3] == kind]
    spec = get_spec(kind)
    try:
        keyset = statements.group_candidates(spec)
        candidate_rows = [
            {
                "ord": ord_,
                "job_id": job_id,
                "property_id": prop,
                "after_id": 0,
                "cutoff": db_datetime(cutoff),
                "lim": 1000,
            }
            for ord_, (job_id, _po, prop, _k, cutoff) in enumerate(items)
        ]
        full = {**pipeline_sql.rows_params("g", statements.CANDIDATE_COLUMNS, candidate_rows), "budget": 1001}
        # The same statement (same CTE ``g``, same parameters, same global limit), the
        # rows found through the due index instead.
        due: Statement = pg.SQL(
            """
            WITH {g}
            SELECT x.ord, x.job_id, COUNT(*), COUNT(x.id), MAX(x.id) FROM (
                SELECT g.ord, g.job_id, c.id FROM g LEFT JOIN LATERAL (
                    SELECT d.id FROM (
                        SELECT r.id FROM {table} r
                        WHERE r.property_id = g.property_id AND r.{ts} < g.cutoff AND r.id > g.after_id OFFSET 0
                    ) d ORDER BY d.id LIMIT g.lim
                ) c ON true
                LIMIT %(budget)s
            ) x GROUP BY x.ord, x.job_id
            """
        ).format(
            g=pipeline_sql.rows_cte("g", statements.CANDIDATE_COLUMNS),
            table=pg.Identifier(spec.table),
            ts=pg.Identifier(spec.timestamp_column),
        )
    except (AttributeError, TypeError) as exc:
        keyset = None
        out["candidates"] = f"skipped ({type(exc).__name__})"
    if keyset:

        def by_job(result: list[Any]) -> dict[int, tuple[int, Any]]:
            # (ord, job id, rows returned, candidates, last id)
            return {int(r[1]): (int(r[3]), r[4]) for r in result}

        found_rows = by_job(_rolled_back(keyset, full))
        same = found_rows == by_job(_rolled_back(due, full))
        out["candidates"] = {
            "kind": kind,
            "partitions": len(items),
            "keyset_index": _explain_ms(keyset, full),
            "due_index": _explain_ms(due, full),
            "keyset_client_ms": _median_ms(lambda: _rolled_back(keyset, full)),
            "due_client_ms": _median_ms(lambda: _rolled_back(due, full)),
            "same_result": same,
            "keyset_plan": _explain_text(keyset, full)[:26],
        }
        # The group DELETE over the same partitions' candidate ranges (as _delete runs it).
        try:
            found = {job_id: last for job_id, (_n, last) in found_rows.items()}
            found_candidates = _rolled_back(keyset, full)
            ids = [i for row in found_candidates for i in (row[5] if len(row) > 5 else None) or ()]
            # The candidates' timestamp span (columns 6 and 7), as _delete passes it.
            spans = [row[6:8] for row in found_candidates if len(row) > 7 and row[6] is not None]
            ranges = [
                {
                    "property_id": prop,
                    "portfolio_id": portfolio,
                    "after_id": 0,
                    "last_id": found[job_id],
                    "cutoff": db_datetime(cutoff),
                }
                for job_id, portfolio, prop, _k, cutoff in items
                if found.get(job_id)
            ]
            # The eligibility predicate is the statement's own (kind ``%(kind)s``).
            statement = statements.group_delete(spec)
            delete_params = {
                **pipeline_sql.rows_params("g", statements.DELETE_COLUMNS, ranges),
                "kind": kind,
                "ids": ids,  # the candidates, as _delete passes them
                "ts_lo": min((lo for lo, _ in spans), default=None),
                "ts_hi": max((hi for _, hi in spans), default=None),
            }
            out["delete"] = {
                "partitions": len(ranges),
                "server": _explain_ms(statement, delete_params),
                "client_ms": _median_ms(lambda: _rolled_back(statement, delete_params), repeat=5),
                "plan": _explain_text(statement, delete_params)[:26],
            }
        except (AttributeError, TypeError, ImportError) as exc:
            out["delete"] = f"skipped ({type(exc).__name__})"

    # Ledger insert: the committed statement (13 arrays through unnest) against the same
    # rows as a VALUES list of 1,300 scalar parameters.
    now = datetime.now(UTC)
    versions = dict(
        sql(
            "SELECT id, policy_version_id FROM cleanup_ops_cleanupjob WHERE id = ANY(%s)",
            [[j[0] for j in jobs]],
        )
    )
    ledger_rows = [
        {
            "operation_id": f"bench-plan-{job_id}-{time.monotonic_ns()}",
            "job_id": job_id,
            "portfolio_id": po,
            "property_id": prop,
            "record_kind": k,
            "policy_version_id": versions[job_id],
            "cutoff": db_datetime(cutoff),
            "after_id": 0,
            "last_id": 1,
            "batch_limit": 1000,
            "candidates": 1,
            "rows_deleted": 1,
            "rows_held": 0,
            "applied_at": db_datetime(now),
        }
        for job_id, po, prop, k, cutoff in jobs
    ]
    try:
        # The committed form's insert (the ledger CTE of
        # ``statements.ledger_insert_and_jobs_advance``), alone.
        columns = statements.LEDGER_COLUMNS
        listed = pg.SQL(", ").join(pg.Identifier(column) for column, _ in columns)
        arrays: Statement | None = pg.SQL(
            "WITH {g} INSERT INTO cleanup_ops_ledgerentry ({listed}) SELECT {listed} FROM g"
        ).format(g=pipeline_sql.rows_cte("g", columns), listed=listed)
        array_params = pipeline_sql.rows_params("g", columns, ledger_rows)
    except (AttributeError, TypeError) as exc:
        arrays = None
        out["ledger_insert"] = f"skipped ({type(exc).__name__})"
    if arrays:
        scalar = pg.SQL(
            "WITH g({names}) AS (VALUES {values}) INSERT INTO cleanup_ops_ledgerentry ({names}) SELECT {names} FROM g"
        ).format(
            names=listed,
            values=pipeline_sql.values_list(len(ledger_rows), [sql_type for _, sql_type in columns]),
        )
        flat = [row[column] for row in ledger_rows for column, _ in columns]
        out["ledger_insert"] = {
            "rows": len(ledger_rows),
            "scalar_params": len(flat),
            "array_params": len(array_params),
            "scalar_client_ms": _median_ms(lambda: _rolled_back(scalar, flat)),
            "scalar_server_ms": _explain_ms(scalar, flat),
            "arrays_client_ms": _median_ms(lambda: _rolled_back(arrays, array_params)),
            "arrays_server_ms": _explain_ms(arrays, array_params),
        }

    # The finishing job update (state -> done: not HOT) against a HOT update.
    try:
        advance = statements.group_jobs_advance()
        finishing = [
            {
                "job_id": job_id,
                "new_cursor": 1,
                "add_batches": 1,
                "add_deleted": 1,
                "add_held": 0,
                "batch_size": 1000,
                "state": JobState.DONE.value,
                "outcome": JobOutcome.DELETED.value,
            }
            for job_id, *_ in jobs
        ]
        adv_params = {
            **pipeline_sql.rows_params("g", statements.ADVANCE_COLUMNS, finishing),
            "now": db_datetime(now),
            "renew": db_datetime(now + timedelta(seconds=60)),
        }
    except (AttributeError, TypeError) as exc:
        advance = None
        out["job_update"] = f"skipped ({type(exc).__name__})"
    if advance:
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
