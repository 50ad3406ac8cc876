#!/usr/bin/env python
"""Issue 40, item 1: the product's batch against a PL/pgSQL function per batch, on the same data.

Run from the repository root::

    .venv/bin/python bench/batch_function.py                      # 100,000 leases, 2 rounds
    .venv/bin/python bench/batch_function.py --rows 200000 --rounds 3 --nice -10

Without ``DATABASE_URL`` it starts a throwaway PostgreSQL with ``pg_stat_statements``
(as ``bench/pipeline.py`` does) and removes it on every exit path. The data is the
backlog shape of ``bench/dataset.py`` (leases, integer keys, 100 portfolios, 307
properties, one big portfolio with half of the rows over 10 properties, 6 properties
under a property-level legal hold and 40 record-level holds), loaded once and
snapshotted; every run starts from a fresh file-level copy of it.

Three runs per round, alternated (A, B, loop; then B, A, loop …):

* **A, the product's batch**: ``sweep_trigger``, then per job ``job_lease`` and
  ``job_load`` (not timed), then ``run_group_batch`` of that one job in a loop until
  it finishes, as ``execution.runner`` drives it; each call timed.
* **B, the function**: the same jobs leased the same way, then one
  ``SELECT … FROM bench_batch(…)`` per batch in autocommit (its own transaction),
  each call timed. The function (``bench/batch_function.sql``) runs the product's
  own statements (fence with scope locks, policy read with the ledger lookup, the
  lease kind's candidates and DELETE, ledger insert with the job's advance, the
  sweep's lock and finish), rendered from ``cleanup_ops.execution.statements`` with
  their parameters bound to its variables; it computes the operation id itself.
* **loop**: ``bench/baselines.run_loop``, the DELETE loop the product is compared with.

Per batch: client-seen ms (median, p90) for batches that continue their job and for
those that finish it; server time (``pg_stat_statements``, top-level statements:
execution + planning; B's nested statements are inside its call) summed per job and
divided by the batches; rows deleted per second of batch time. Round trips per batch
are read from libpq's trace (``ReadyForQuery`` messages received) in one extra traced
run of each. Every run is verified (``dataset.verify``: rows and id sum deleted as the
predicate admits, every held row still there, ledger and jobs agree, no job open), and
A and B must write the same operation ids to the ledger.
"""

# ruff: noqa: E402 - the bench and harness imports need the repository root on sys.path first

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg
from psycopg import pq
from psycopg import sql as pg

from bench.baselines import run_loop
from bench.common import code_version, django_setup, log, sql
from bench.dataset import Dataset, build_scope, load_records, restore, snapshot, verify
from bench.statements import PgStats
from harness.postgres import Cluster, ClusterError, admin_url, create_database
from harness.procs import renice

TEMPLATE = Path(__file__).with_name("batch_function.sql")
BATCH_FN = "bench_batch"
# The DELETE's parameters, numbered as the function's EXECUTE … USING passes them
# (batch_function.sql: p_property, p_portfolio, v_cursor, v_cutoff, v_limit, p_kind).
DELETE_USING: dict[str, pg.Composable] = {
    "property_id": pg.SQL("$1"),
    "portfolio_id": pg.SQL("$2"),
    "after_id": pg.SQL("$3"),
    "cutoff": pg.SQL("$4"),
    "lim": pg.SQL("$5"),
    "kind": pg.SQL("$6"),
}


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- the function


# A parameter in a template's text (``sql.composed`` passes ``%(name)s`` through),
# or a literal percent sign doubled for the driver.
PARAMETER = re.compile(r"%%|%\((\w+)\)s")


def bound(statement: pg.Composable, values: Mapping[str, pg.Composable]) -> pg.Composable:
    """``statement`` with each named parameter replaced by ``values[name]`` (a
    PL/pgSQL variable, an array of one, a literal), walking the ``Composed`` tree:
    the product's statement as composed, only its parameters bound otherwise — a
    ``Placeholder``, or ``%(name)s`` in a template's text, which is where psycopg
    itself would bind it (``%%`` becomes ``%``: the function's text is sent without
    parameters). An unmapped name raises ``KeyError``. psycopg exposes a
    ``Composed``'s parts, an ``SQL``'s text and a placeholder's name only as ``_obj``."""
    if isinstance(statement, pg.Placeholder):
        return values[statement._obj]
    if isinstance(statement, pg.Composed):
        return pg.Composed([bound(part, values) for part in statement._obj])
    if isinstance(statement, pg.SQL):
        text: str = statement._obj
        parts: list[pg.Composable] = []
        at = 0
        for match in PARAMETER.finditer(text):
            parts.append(pg.SQL(text[at : match.start()]))  # type: ignore[arg-type]  # the product's own text
            parts.append(pg.SQL("%") if match.group(1) is None else values[match.group(1)])
            at = match.end()
        parts.append(pg.SQL(text[at:]))  # type: ignore[arg-type]
        return pg.Composed(parts)
    return statement


def _var(name: str) -> pg.Composable:
    return pg.SQL(name)  # one of the function's own variable names (batch_function.sql)


def _one(name: str) -> pg.Composable:
    """An array parameter (``sql.rows_cte``, ``sql.any_of``) of the one job's value."""
    return pg.SQL("ARRAY[{}]").format(pg.SQL(name))


def function_text(conn: psycopg.Connection[Any]) -> pg.Composed:
    """``batch_function.sql`` filled with the product's statements for the lease kind."""
    from cleanup_ops import sql as product_sql
    from cleanup_ops import sweeps
    from cleanup_ops.execution import statements
    from cleanup_ops.execution.candidates import pruning
    from cleanup_ops.lifecycle import JobOutcome, JobState
    from retention.conf import MAX_BATCH_SIZE
    from retention.models import PolicyVersion
    from retention.registry import get_spec

    spec = get_spec("lease")
    approved = pg.Literal(PolicyVersion.Status.APPROVED.value)
    fence = bound(
        statements.group_fence_scopes_and_policies(),
        {
            "ids": _one("p_job"),
            "g_job_id": _one("p_job"),
            "g_property_id": _one("p_property"),
            "g_portfolio_id": _one("p_portfolio"),
            "g_record_kind": _one("p_kind"),
            "state": pg.Literal(JobState.LEASED.value),
            "token": _var("p_token"),
            "now": _var("p_now"),
            "approved": approved,
        },
    )
    policy = bound(
        statements.policies_and_ledger_lookup(),
        {
            "p_job_id": _one("p_job"),
            "p_portfolio_id": _one("p_portfolio"),
            "p_record_kind": _one("p_kind"),
            "ops": _one("v_guess_op"),
            "approved": approved,
        },
    )
    lookup = bound(statements.ledger_lookup(), {"ops": _one("v_op")})
    # The data statement goes through EXECUTE: planned for its values every time,
    # as the product plans it (not prepared: batches.run_group_batch says why).
    delete = bound(statements.partition_count_and_delete(spec, pruning=pruning(spec)), DELETE_USING)
    advance_values: dict[str, pg.Composable] = {
        "g_job_id": _one("p_job"),
        "g_new_cursor": _one("a_cursor"),
        "g_add_batches": _one("a_batches"),
        "g_add_deleted": _one("a_deleted"),
        "g_add_held": _one("a_held"),
        "g_batch_size": _one("a_size"),
        "g_state": _one("a_state"),
        "g_outcome": _one("a_outcome"),
        "now": _var("p_now"),
        "renew": _var("p_renew"),
    }
    ledger_values: dict[str, pg.Composable] = {
        "l_operation_id": _one("v_op"),
        "l_job_id": _one("p_job"),
        "l_portfolio_id": _one("p_portfolio"),
        "l_property_id": _one("p_property"),
        "l_record_kind": _one("p_kind"),
        "l_policy_version_id": _one("v_used_version"),
        "l_cutoff": _one("v_cutoff"),
        "l_after_id": _one("v_cursor"),
        "l_last_id": _one("v_last"),
        "l_batch_limit": _one("v_limit"),
        "l_candidates": _one("v_candidates"),
        "l_rows_deleted": _one("o_deleted"),
        "l_rows_held": _one("v_held"),
        "l_applied_at": _one("p_now"),
    }
    # The sweep's statements are private to cleanup_ops.sweeps (its protocol's);
    # read here, not imported, because the function must run the same texts.
    sweep = {"sweep": _var("p_sweep"), "now": _var("p_now")}
    template = pg.SQL(TEMPLATE.read_text())  # type: ignore[arg-type]  # our own file, not user input
    return template.format(
        stamp=pg.Identifier(f"{BATCH_FN}_stamp"),
        operation=pg.Identifier(f"{BATCH_FN}_operation"),
        batch=pg.Identifier(BATCH_FN),
        property_key=pg.SQL(product_sql.PROPERTY_KEY),  # type: ignore[arg-type]  # a type name from settings
        portfolio_key=pg.SQL(product_sql.PORTFOLIO_KEY),  # type: ignore[arg-type]
        fence=fence,
        policy=policy,
        lookup=lookup,
        delete=pg.Literal(delete.as_string(conn)),
        advance=bound(statements.group_jobs_advance(), advance_values),
        ledger_and_advance=bound(
            statements.ledger_insert_and_jobs_advance(keys=False), {**advance_values, **ledger_values}
        ),
        sweep_lock=bound(sweeps._sweep_lock_running(), sweep),
        sweep_finish=bound(sweeps._sweep_finish_if_drained(), sweep),
        scope_missing=pg.Literal(JobOutcome.SCOPE_MISSING.value),
        policy_withdrawn=pg.Literal(JobOutcome.POLICY_WITHDRAWN.value),
        done=pg.Literal(JobState.DONE.value),
        leased=pg.Literal(JobState.LEASED.value),
        deleted=pg.Literal(JobOutcome.DELETED.value),
        held=pg.Literal(JobOutcome.HELD.value),
        nothing_eligible=pg.Literal(JobOutcome.NOTHING_ELIGIBLE.value),
        max_batch=pg.Literal(MAX_BATCH_SIZE),
    )


def install_function() -> None:
    """CREATE the prototype in the benchmark's database (before the snapshot, so every
    copy has it); A never calls it."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    text = function_text(raw)
    with raw.cursor() as cur:
        cur.execute(text)


CALL = pg.SQL(
    """
    SELECT o_deleted, o_outcome, o_lost FROM {batch}(
        %(job)s, %(token)s, %(property)s, %(portfolio)s, %(kind)s, %(slot)s, %(cutoff)s, %(version)s,
        %(sweep)s, %(now)s, %(renew)s, %(limit)s
    )
    """
).format(batch=pg.Identifier(BATCH_FN))


# --------------------------------------------------------------------------- the runs


@dataclass
class Batch:
    ms: float
    deleted: int
    finishing: bool
    round_trips: int = 0


@dataclass
class Run:
    label: str
    batches: list[Batch] = field(default_factory=list)
    server_exec_ms: float = 0.0
    server_plan_ms: float = 0.0
    server_statements: int = 0
    by_statement: Counter[str] = field(default_factory=Counter)
    nested_ms: Counter[str] = field(default_factory=Counter)
    top_ms: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0  # wall time, leases included
    ok: bool = False
    deleted: int = 0
    ledger_digest: str = ""


class ServerTime:
    """Top-level statements' execution and planning time in our database
    (``pg_stat_statements``), reset before a job's batches and read after them, on
    an admin connection to another database (its own statements are not counted)."""

    def __init__(self, url: str) -> None:
        self.admin_url, self.db = admin_url(url)
        self.conn = psycopg.connect(self.admin_url, autocommit=True)
        self.dbid = 0

    def reset(self) -> None:
        self.dbid = self.conn.execute("SELECT oid FROM pg_database WHERE datname = %s", [self.db]).fetchone()[0]
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def read(self, *, nested: bool = False) -> list[tuple[str, float, float, int]]:
        """(the statement's first words, execution ms, planning ms, calls) per
        top-level statement; ``nested``: those a function or trigger ran, instead
        (``pg_stat_statements.track = all`` in the session that ran them)."""
        rows = self.conn.execute(
            """
            SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 60), total_exec_time, total_plan_time, calls
            FROM pg_stat_statements WHERE toplevel <> %s AND dbid = %s AND query NOT LIKE %s
            """,
            [nested, self.dbid, "%pg_stat_statements%"],
        ).fetchall()
        return [(str(q), float(e), float(p), int(c)) for q, e, p, c in rows]

    def close(self) -> None:
        self.conn.close()


@contextmanager
def traced(path: Path) -> Iterator[None]:
    """libpq's trace of this session's messages into ``path`` while inside."""
    from django.db import connection

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        pgconn.trace(fd)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        yield
    finally:
        pgconn.untrace()
        os.close(fd)


def round_trips(path: Path) -> int:
    """Waits for the server: every ``ReadyForQuery`` ends one (a Query or a Sync)."""
    return sum(1 for line in path.read_text().splitlines() if line.startswith("B\t") and "ReadyForQuery" in line)


BatchCall = Callable[[Any, Any, datetime], tuple[int, str]]


def product_batch(batch: int) -> BatchCall:
    from cleanup_ops.execution.batches import run_group_batch

    def call(job: Any, lease: Any, now: datetime) -> tuple[int, str]:
        step = run_group_batch(jobs=[job], lease=lease, limit=batch, now=now)[job.id]
        if step.lost:
            raise RuntimeError(f"lease lost on job {job.id}")
        return step.deleted, step.outcome

    return call


def function_batch(batch: int) -> BatchCall:
    from django.db import connection

    from cleanup_ops.execution.leases import lease_renewal, token_param
    from retention.eligibility import db_datetime

    def call(job: Any, lease: Any, now: datetime) -> tuple[int, str]:
        params = {
            "job": job.id,
            "token": token_param(lease.token),
            "property": job.property_id,
            "portfolio": job.portfolio_id,
            "kind": job.record_kind,
            "slot": db_datetime(job.slot),
            "cutoff": db_datetime(job.cutoff),
            "version": job.policy_version_id,
            "sweep": job.sweep_id,
            "now": db_datetime(now),
            "renew": lease_renewal(now),
            "limit": batch,
        }
        with connection.cursor() as cur:  # autocommit: the call is its own transaction
            cur.execute(CALL, params)
            deleted, outcome, lost = cur.fetchone()
        if lost:
            raise RuntimeError(f"lease lost on job {job.id}")
        return int(deleted), str(outcome)

    return call


def drive(label: str, call: BatchCall, ds: Dataset, slot: datetime, server: ServerTime, trace_dir: Path | None) -> Run:
    """Admit the sweep, then each job: lease and load it (not timed), then its
    batches until it finishes, each call timed."""
    from cleanup_ops import clock
    from cleanup_ops.execution.batches import job_load
    from cleanup_ops.execution.leases import job_lease
    from cleanup_ops.models import CleanupJob
    from cleanup_ops.schedule import sweep_trigger

    run = Run(label)
    if trace_dir:
        # The traced run also has the statements a function or trigger runs counted.
        sql("SET pg_stat_statements.track = 'all'")
    sweep_trigger(slot=slot)
    job_ids = list(CleanupJob.objects.filter(job_kind="delete").order_by("id").values_list("id", flat=True))
    started = time.perf_counter()
    for job_id in job_ids:
        lease = job_lease(job_id=job_id, owner=f"bench-{label}", now=clock.now())
        if lease is None:
            raise RuntimeError(f"{label}: job {job_id} could not be leased")
        job = job_load(job_id)
        server.reset()
        outcome = ""
        while not outcome:
            now = clock.now()
            trace = trace_dir / "trace" if trace_dir else None
            t0 = time.perf_counter()
            if trace is None:
                deleted, outcome = call(job, lease, now)
            else:
                with traced(trace):
                    deleted, outcome = call(job, lease, now)
            ms = 1000 * (time.perf_counter() - t0)
            run.batches.append(Batch(ms, deleted, bool(outcome), round_trips(trace) if trace else 0))
        for query, exec_ms, plan_ms, calls in server.read():
            run.server_exec_ms += exec_ms
            run.server_plan_ms += plan_ms
            run.server_statements += calls
            run.by_statement[query] += calls
            run.top_ms[query] += exec_ms + plan_ms
        if trace_dir:
            for query, exec_ms, plan_ms, _calls in server.read(nested=True):
                run.nested_ms[query] += exec_ms + plan_ms
    run.seconds = time.perf_counter() - started
    check = verify(ds, label, pipeline=True)
    run.ok, run.deleted = bool(check["ok"]), int(check["deleted"])
    run.ledger_digest = sql(
        "SELECT md5(COALESCE(string_agg(operation_id, ',' ORDER BY operation_id), '')) FROM cleanup_ops_ledgerentry"
    )[0][0]
    return run


# --------------------------------------------------------------------------- figures


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(run: Run) -> dict[str, Any]:
    cont = [b.ms for b in run.batches if not b.finishing]
    fin = [b.ms for b in run.batches if b.finishing]
    batch_seconds = sum(b.ms for b in run.batches) / 1000
    n = len(run.batches)
    return {
        "label": run.label,
        "batches": n,
        "continuing": len(cont),
        "finishing": len(fin),
        "cont_p50": statistics.median(cont) if cont else 0.0,
        "cont_p90": pct(cont, 90),
        "fin_p50": statistics.median(fin) if fin else 0.0,
        "fin_p90": pct(fin, 90),
        "all_mean": 1000 * batch_seconds / max(n, 1),
        "server_ms": (run.server_exec_ms + run.server_plan_ms) / max(n, 1),
        "server_plan_ms": run.server_plan_ms / max(n, 1),
        "statements": run.server_statements / max(n, 1),
        "batch_seconds": batch_seconds,
        "rows_per_s": run.deleted / batch_seconds if batch_seconds else 0.0,
        "seconds": run.seconds,
        "deleted": run.deleted,
        "ok": run.ok,
    }


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nice", type=int, default=0, help="renice this process and our PostgreSQL")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    pg_cluster: Cluster | None = None
    server: ServerTime | None = None
    try:
        if args.nice:
            renice(os.getpid(), args.nice)
        if not os.environ.get("DATABASE_URL"):
            try:
                pg_cluster = Cluster()
            except ClusterError as exc:
                raise SystemExit(f"bench: no DATABASE_URL and {exc}") from exc
            os.environ["DATABASE_URL"] = pg_cluster.start()
            log(f"throwaway PostgreSQL ({pg_cluster.bin}) in {pg_cluster.dir}")
        url = os.environ["DATABASE_URL"]
        stats = PgStats(url)
        stats.enable(pg_cluster, log)
        if stats.method != "pg_stat_statements":
            raise SystemExit("bench: needs pg_stat_statements for the server time")
        if pg_cluster is not None and args.nice:
            pg_cluster.renice(args.nice)
        create_database(url)
        django_setup(args.batch_size)
        from django.core.management import call_command

        from cleanup_ops.schedule import slot_current

        call_command("migrate", verbosity=0, interactive=False)
        call_command("createcachetable", verbosity=0)
        slot = slot_current()
        scope = build_scope()
        ds = load_records(scope, args.rows, slot)
        install_function()
        log(f"snapshot in {snapshot():.1f} s; {ds.describe()}; {ds.holds} legal holds")
        server = ServerTime(url)
        runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": [], "loop": []}
        digests: set[str] = set()
        calls = {"A": product_batch(args.batch_size), "B": function_batch(args.batch_size)}
        labels = {"A": "A product batch (run_group_batch)", "B": "B PL/pgSQL function, 1 call"}
        for n in range(args.rounds):
            order = ["A", "B"] if n % 2 == 0 else ["B", "A"]
            for key in [*order, "loop"]:
                log(f"round {n + 1}: restored in {restore():.1f} s; {key}; load {load_average()}")
                if key == "loop":
                    result = run_loop(ds, args.batch_size, slot)
                    batches = int(result.extra["batches"])
                    runs["loop"].append(
                        {
                            "seconds": result.seconds,
                            "batches": batches,
                            "ms": 1000 * result.seconds / max(batches, 1),
                            "rows_per_s": result.deleted / result.seconds,
                            "deleted": result.deleted,
                            "ok": result.ok,
                            "load": load_average(),
                        }
                    )
                    continue
                run = drive(key, calls[key], ds, slot, server, None)
                digests.add(run.ledger_digest)
                runs[key].append({**summary(run), "load": load_average()})
                log(f"  {runs[key][-1]}")
        trips: dict[str, dict[str, float]] = {}
        with tempfile.TemporaryDirectory() as folder:
            for key in ("A", "B"):
                log(f"traced run: restored in {restore():.1f} s; {key}")
                run = drive(key, calls[key], ds, slot, server, Path(folder))
                digests.add(run.ledger_digest)
                cont = [b.round_trips for b in run.batches if not b.finishing]
                fin = [b.round_trips for b in run.batches if b.finishing]
                per_batch = {
                    q: (round(c / len(run.batches), 2), round(run.top_ms[q] / len(run.batches), 2))
                    for q, c in run.by_statement.most_common(12)
                }
                log(f"{key}: statements per batch received by the server (calls, ms): {per_batch}")
                nested = {q: round(ms / len(run.batches), 2) for q, ms in run.nested_ms.most_common(12)}
                log(f"{key}: ms per batch of the statements run inside (a function, a trigger): {nested}")
                trips[key] = {
                    "cont_median": statistics.median(cont) if cont else 0,
                    "cont_max": max(cont, default=0),
                    "fin_median": statistics.median(fin) if fin else 0,
                    "fin_max": max(fin, default=0),
                    "ok": run.ok,
                }
        report(args, ds, runs, trips, digests, labels)
    finally:
        if server is not None:
            server.close()
        if pg_cluster is not None:
            from django.db import connections

            connections.close_all()
            pg_cluster.stop()


def report(
    args: argparse.Namespace,
    ds: Dataset,
    runs: dict[str, list[dict[str, Any]]],
    trips: dict[str, dict[str, float]],
    digests: set[str],
    labels: dict[str, str],
) -> None:
    print(f"code: {code_version()}; rows {ds.total:,}, eligible {ds.eligible:,}, held past cutoff {ds.held:,};")
    print(f"batch size {args.batch_size}; {args.rounds} rounds, alternated; load at the end {load_average()}")
    print(f"same operation ids on the ledger in every A and B run: {'yes' if len(digests) == 1 else 'NO'}")
    head = (
        f"{'run':<36} {'batches':>7} {'cont p50':>8} {'p90':>6} {'fin p50':>8} {'p90':>6} {'mean':>6}"
        f" {'server':>6} {'stmts':>5} {'rows/s':>8} {'wall s':>6} {'check':>5}  load"
    )
    print(head)
    for key in ("A", "B"):
        for r in runs[key]:
            print(
                f"{labels[key]:<36} {r['batches']:>7} {r['cont_p50']:>8.2f} {r['cont_p90']:>6.2f}"
                f" {r['fin_p50']:>8.2f} {r['fin_p90']:>6.2f} {r['all_mean']:>6.2f} {r['server_ms']:>6.2f}"
                f" {r['statements']:>5.1f} {r['rows_per_s']:>8,.0f} {r['seconds']:>6.2f}"
                f" {'ok' if r['ok'] else 'FAIL':>5}  {r['load']}"
            )
    for r in runs["loop"]:
        print(
            f"{'loop DELETE … LIMIT (baselines.run_loop)':<36} {r['batches']:>7} {'':>8} {'':>6} {'':>8} {'':>6}"
            f" {r['ms']:>6.2f} {'':>6} {'1.0':>5} {r['rows_per_s']:>8,.0f} {r['seconds']:>6.2f}"
            f" {'ok' if r['ok'] else 'FAIL':>5}  {r['load']}"
        )
    for key in ("A", "B"):
        t = trips[key]
        print(
            f"round trips per batch, {labels[key]}: continuing median {t['cont_median']:g} (max {t['cont_max']:g}),"
            f" finishing median {t['fin_median']:g} (max {t['fin_max']:g}); traced run {'ok' if t['ok'] else 'FAIL'}"
        )


if __name__ == "__main__":
    main()
