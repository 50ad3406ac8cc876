#!/usr/bin/env python
"""Throughput benchmark: the cleanup pipeline against a plain DELETE loop.

Run from the repository root (see bench/README.md)::

    .venv/bin/python bench/pipeline.py                 # backlog: 1,000,000 leases (~4-5 minutes)
    .venv/bin/python bench/pipeline.py --rows 100000   # quick run (~1.5 minutes)
    .venv/bin/python bench/pipeline.py --shape nightly # nightly steady state (~10 minutes)
    bash bench/run-at-head.sh --shape nightly          # the same against committed HEAD

Two dataset shapes (``bench/dataset.py``): ``backlog`` (the first cleanup: leases,
~96% past the cutoff, ~300 partitions) and ``nightly`` (every night after that: 150
portfolios x 10 properties x 3 record kinds, 450,000 rows, ~1% just past the cutoff,
thousands of small partitions). Statements are counted for every run, server-side with
``pg_stat_statements`` and, for the ``count`` run, in-process per statement class
(``bench/statements.py``); ``pickup`` and ``idle`` measure a warm, idle 2-worker
cluster (``bench/latency.py``).

Without ``DATABASE_URL`` it starts a throwaway PostgreSQL (``harness/postgres.py``,
the launcher behind ``scripts/pg-cluster.sh``) and removes it on every exit path. With
``DATABASE_URL`` set it uses that (empty!) database: it overwrites it, and
drops and re-creates it from a snapshot before every run (needs CREATEDB).

Every run starts from the same database: after generating the data the whole
database is copied at file level (``CREATE DATABASE … TEMPLATE``), and each run
gets a fresh copy, so pages, indexes, statistics and visibility map are
identical. Runs:

* ``loop``: one process, ``DELETE … WHERE id IN (SELECT … ORDER BY property_id,
  id LIMIT batch)`` per property with the same eligibility predicate, one
  transaction per batch (the design the product replaces);
* ``loop2``: the same loop with run_batch's two data statements (candidates,
  then a ranged DELETE) and none of the protocol;
* ``q1``/``q2`` (and ``q1x``/``q2x`` with a dispatcher window one larger):
  ``sweep_trigger`` then real ``manage.py qcluster`` processes until no job is
  pending or leased;
* ``drain``: ``cleanup_drain`` in one process, no broker;
* ``count``: ``cleanup_drain`` again with an execute wrapper counting statements per
  class, per-function timers and the client-side time per class;
* ``rss``: peak RSS of a worker at a second dataset size; ``admission``:
  ``sweep_trigger`` over 10,000 properties x every kind with policies;
* ``pickup``/``idle``: pickup latency of a new sweep, a retry and a redrive, and the
  statements an idle cluster sends (``bench/latency.py``).

Every run is verified: the rows deleted are exactly those the predicate
admits (count and id sum) and every held row is still there.

This file is the command line; the dataset is in ``bench/dataset.py``, the runs
in ``bench/runs.py`` (the DELETE loops in ``bench/baselines.py``), the output in
``bench/report.py``, and the PostgreSQL, qcluster and CPU-watch machinery in
``harness/``.
"""

# ruff: noqa: E402 - the bench and harness imports need the repository root on sys.path first

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts bench/ on the path; the packages live at the root.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import report
from bench import runs as runs_module
from bench.baselines import run_loop, run_loop_ranged, run_single_delete
from bench.common import code_version, django_setup, log
from bench.dataset import (
    NIGHTLY_PORTFOLIOS,
    NIGHTLY_PROPERTIES,
    build_nightly_scope,
    build_scope,
    load_nightly,
    load_records,
    pristine_name,
    restore,
    snapshot,
)
from bench.runs import RunResult, admission_phase, child_main, run_child, run_qcluster
from bench.statements import PgStats
from harness.cpu import CpuWatch
from harness.postgres import Cluster, ClusterError, create_database, drop_database
from harness.procs import renice
from harness.qcluster import QCluster


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shape",
        choices=["backlog", "nightly"],
        default="backlog",
        help="backlog: leases, ~96%% past the cutoff, ~300 partitions (default); nightly: 150 portfolios x 10"
        " properties x 3 kinds, ~1%% past the cutoff",
    )
    parser.add_argument("--rows", type=int, help="rows (default: backlog 1,000,000; nightly 450,000 over 3 kinds)")
    parser.add_argument("--portfolios", type=int, default=NIGHTLY_PORTFOLIOS, help="nightly: portfolios")
    parser.add_argument("--properties", type=int, default=NIGHTLY_PROPERTIES, help="nightly: properties per portfolio")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--rss-rows",
        type=int,
        help="second dataset size for the peak-RSS comparison (0: skip; default backlog 100,000, nightly 150,000)",
    )
    parser.add_argument(
        "--admission-properties",
        type=int,
        default=100,
        help="admission test: properties per portfolio over 100 portfolios, each with rows of every kind that"
        " has policies (default 100: 10,000 properties; 30,000 partitions in the nightly shape)",
    )
    parser.add_argument("--pickup-samples", type=int, default=20, help="pickup: samples per scenario (default 20)")
    parser.add_argument(
        "--plans-group", type=int, default=100, help="plans: partitions in the group timed (default 100)"
    )
    parser.add_argument(
        "--lease-jobs",
        type=int,
        default=400,
        help="phase drainL: cleanup_drain with CLEANUP_LEASE_JOBS set to this (default 400; the setting's"
        " default is 100)",
    )
    parser.add_argument(
        "--only",
        help="comma list of phases. Backlog default: loop,loop2,q1,q2,q1x,drain,count,rss,admission. Nightly"
        " default: loop,one,drain,drainL,count,q2,q1,rss,plans,pickup,idle,admission. loop2: the loop with"
        " run_batch's two data statements (backlog only); drainL: cleanup_drain with --lease-jobs; plans: one"
        " group's statements timed in isolation; q1/q2/q4: qcluster with 1/2/4 workers; q1x/q2x: the same with"
        " CLEANUP_DISPATCH_WINDOW = 2 x workers + 1; count: cleanup_drain with statements counted per class",
    )
    parser.add_argument("--save", type=Path, help="also write every figure as JSON to this file")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each timed phase this many times and keep the fastest (default 1)"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each timed run wait up to this long until other processes use < 0.25 cores (default: don't)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="scheduling priority for this benchmark's processes and its own PostgreSQL (e.g. -10 as root on a"
        " shared machine, so other work disturbs the figures less; default 0)",
    )
    parser.add_argument(
        "--broker",
        choices=["orm", "redis", "sqs", "rabbitmq"],
        default="orm",
        help="Q_BROKER for this process and the qclusters; redis/sqs/rabbitmq start a throwaway server on loopback"
        " (harness/brokers.py) unless its URL is in the environment (default orm)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="with --repeat: run the timed phases round by round (loop, drain, qcluster, …, then again) instead of"
        " each phase N times in a row, and report each run's median ratio to the loop of the same round",
    )
    parser.add_argument(
        "--plain-activity",
        action="store_true",
        help="migrate tenant activity back to a plain table (properties 0005, as before its monthly table"
        " partitions) before the dataset: the schema the nightly was measured on before issue 28",
    )
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md (Backlog)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the qcluster logs (their directory is printed)")
    parser.add_argument("--child", choices=["drain", "count"], help=argparse.SUPPRESS)
    parser.add_argument("--slot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be 1-1000 (CLEANUP_BATCH_SIZE's range)")
    if args.child:
        child_main(args)
        return
    nightly = args.shape == "nightly"
    if args.rows is None:
        args.rows = 450_000 if nightly else 1_000_000
    if args.rss_rows is None:
        args.rss_rows = 150_000 if nightly else 100_000
    if args.only is None:
        args.only = (
            "loop,one,drain,drainL,count,q2,q1,rss,plans,pickup,idle,admission"
            if nightly
            else "loop,loop2,q1,q2,q1x,drain,count,rss,admission"
        )
    phases = set(args.only.split(","))
    if nightly and "loop2" in phases:
        parser.error("loop2 is for the backlog shape only (leases, per property)")

    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    pg: Cluster | None = None
    live: list[QCluster] = []
    log_dir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    watch = CpuWatch()
    broker_server = None
    try:
        if args.broker != "orm":  # before Django starts: this process dispatches, the qclusters inherit env
            from harness.brokers import BrokerServer, broker_env

            needed = {"redis": "Q_REDIS_URL", "sqs": "Q_SQS_ENDPOINT_URL", "rabbitmq": "Q_AMQP_URL"}[args.broker]
            if not os.environ.get(needed):
                broker_server = BrokerServer(args.broker)
                os.environ.update(broker_server.start())
                log(f"throwaway {args.broker} server on 127.0.0.1:{broker_server.port}")
            os.environ.update(broker_env(args.broker, {}))
        if args.nice:
            # Our processes only: this one (children inherit it) and our own PostgreSQL.
            renice(os.getpid(), args.nice)
        if not os.environ.get("DATABASE_URL"):
            try:
                pg = Cluster()
            except ClusterError as exc:
                raise SystemExit(f"bench: no DATABASE_URL and {exc}") from exc
            os.environ["DATABASE_URL"] = pg.start()
            log(f"throwaway PostgreSQL ({pg.bin}) in {pg.dir}")
            if pg.postmaster_pid:
                watch.own_roots.add(pg.postmaster_pid)
                if args.nice:
                    pg.renice(args.nice)
        watch.start()
        url = os.environ["DATABASE_URL"]
        if url.split("://", 1)[0] not in {"postgres", "postgresql", "pgsql"}:
            raise SystemExit("bench: DATABASE_URL must point at PostgreSQL")
        stats = PgStats(url)
        stats.enable(pg, log)
        if pg is not None and pg.postmaster_pid:  # a new postmaster after the restart
            watch.own_roots.add(pg.postmaster_pid)
            if args.nice:
                pg.renice(args.nice)
        runs_module.STATS = stats
        log(f"statements counted with {stats.method}")
        create_database(url)
        django_setup(args.batch_size)
        from django.core.management import call_command

        from cleanup_ops.schedule import slot_current

        env = dict(os.environ)
        started = time.perf_counter()
        call_command("migrate", verbosity=0, interactive=False)
        # As a deployment does after migrate (django-q2's cluster status cache, where it is configured).
        call_command("createcachetable", verbosity=0)
        if args.plain_activity:
            call_command("migrate", "properties", "0005_lease_ended_at", verbosity=0, interactive=False)
        plain = " (tenant activity a plain table)" if args.plain_activity else ""
        log(f"migrated in {time.perf_counter() - started:.1f} s{plain}")
        slot = slot_current()
        started = time.perf_counter()
        if nightly:
            scope = build_nightly_scope(args.portfolios, args.properties)
        else:
            scope = build_scope()
        log(f"scope (portfolios, properties, policies) in {time.perf_counter() - started:.1f} s")

        def load(rows: int) -> Any:
            return load_nightly(scope, rows, slot) if nightly else load_records(scope, rows, slot)

        ds = load(args.rows)
        log(f"snapshot of the database in {snapshot():.1f} s")
        log(
            f"dataset: {ds.total:,} rows generated in {ds.generate_seconds:.1f} s; eligible {ds.eligible:,},"
            f" held past cutoff {ds.held:,} ({100 * ds.held / ds.total:.2f}%), {ds.holds} legal holds,"
            f" {len(scope.properties)} properties in {scope.portfolios} portfolios; slot {slot:%Y-%m-%dT%H:%MZ};"
            f" {ds.describe()}"
        )
        runs: list[RunResult] = []

        def measured(run: Callable[[], RunResult]) -> RunResult:
            if args.wait_idle:
                waited = watch.wait_idle(args.wait_idle)
                if waited >= 4:
                    log(f"waited {waited:.0f} s for other processes to go quiet")
            before, started = watch.foreign_seconds, time.monotonic()
            result = run()
            result.extra["other_cpu_cores"] = round((watch.foreign_seconds - before) / (time.monotonic() - started), 2)
            return result

        runs_module.CPU_ROOTS = set(watch.own_roots)

        def keep(samples: list[RunResult]) -> None:
            result = min(samples, key=lambda r: r.seconds)  # the table shows the fastest
            result.ok = all(r.ok for r in samples)
            if len(samples) > 1:
                result.extra["all_seconds"] = [round(r.seconds, 2) for r in samples]
                if all("handoff_seconds_total" in r.extra for r in samples):
                    result.extra["all_handoff_seconds"] = [r.extra["handoff_seconds_total"] for r in samples]
                result.extra["all_other_cpu_cores"] = [r.extra["other_cpu_cores"] for r in samples]
                if all("cpu_seconds" in r.extra for r in samples):
                    result.extra["all_cpu_seconds"] = [r.extra["cpu_seconds"] for r in samples]
            runs.append(result)

        def sample(message: str, run: Callable[[], RunResult]) -> RunResult:
            log(f"restored in {restore():.1f} s; {message}")
            result = measured(run)
            log(
                f"{result.label}: {result.deleted:,} rows in {result.seconds:.2f} s ({'ok' if result.ok else 'FAIL'};"
                f" other processes used {result.extra['other_cpu_cores']:.2f} cores meanwhile)"
            )
            return result

        timed: list[tuple[str, Callable[[], RunResult]]] = []
        if "loop" in phases:
            timed.append(("running the DELETE loop", lambda: run_loop(ds, args.batch_size, slot)))
        if "one" in phases:
            timed.append(("running one DELETE statement", lambda: run_single_delete(ds, slot)))
        if "loop2" in phases:
            timed.append(
                (
                    "running the DELETE loop with run_batch's statements",
                    lambda: run_loop_ranged(ds, args.batch_size, slot),
                )
            )
        for workers in (1, 2, 4):
            if f"q{workers}" in phases:
                timed.append(
                    (
                        f"running qcluster with {workers} worker(s)",
                        lambda w=workers: run_qcluster(ds, w, slot, env, log_dir, live, nice=args.nice),
                    )
                )
        for workers in (1, 2):
            if f"q{workers}x" in phases:
                window = 2 * workers + 1
                timed.append(
                    (
                        f"running qcluster with {workers} worker(s), window {window}",
                        lambda w=workers, n=window: run_qcluster(
                            ds, w, slot, env, log_dir, live, window=n, nice=args.nice
                        ),
                    )
                )
        if "drain" in phases:
            timed.append(
                ("running cleanup_drain in a child process", lambda: run_child("drain", ds, slot, args.batch_size, env))
            )
        if "drainL" in phases:
            timed.append(
                (
                    f"running cleanup_drain with CLEANUP_LEASE_JOBS={args.lease_jobs}",
                    lambda: run_child(
                        "drain", ds, slot, args.batch_size, env, extra_env={"CLEANUP_LEASE_JOBS": str(args.lease_jobs)}
                    ),
                )
            )
        if args.interleave:
            # Round by round (every run once per round), so each round's runs meet
            # about the same load from the rest of the machine.
            rounds = [[sample(message, run) for message, run in timed] for _ in range(args.repeat)]
            for i in range(len(timed)):
                keep([r[i] for r in rounds])
            if "loop" in phases:
                for i, result in enumerate(runs):
                    ratios = [r[0].seconds / r[i].seconds for r in rounds if r[i].seconds]
                    result.extra["round_ratios_vs_loop"] = [round(x, 2) for x in ratios]
                    result.extra["median_ratio_vs_loop"] = round(statistics.median(ratios), 2)
                    cpu = [
                        r[0].extra.get("cpu_seconds", 0) / r[i].extra["cpu_seconds"]
                        for r in rounds
                        if r[i].extra.get("cpu_seconds")
                    ]
                    if cpu:
                        result.extra["median_cpu_ratio_vs_loop"] = round(statistics.median(cpu), 2)
        else:
            for message, run in timed:
                samples = [sample(message, run)]
                for _ in range(args.repeat - 1):
                    samples.append(sample(f"repeating: {samples[0].label}", run))
                keep(samples)
        count_run = None
        if "count" in phases:
            log(f"restored in {restore():.1f} s; running cleanup_drain with statements counted per class")
            count_run = measured(lambda: run_child("count", ds, slot, args.batch_size, env))
            log(f"counted drain: {count_run.seconds:.2f} s ({'ok' if count_run.ok else 'FAIL'})")

        rss_rows: list[tuple[int, str, float]] = []
        for r in runs:
            if "worker_peak_rss_mb" in r.extra:
                rss_rows.append((ds.total, r.label, r.extra["worker_peak_rss_mb"]))
            if "maxrss_mb" in r.extra:
                rss_rows.append((ds.total, r.label, r.extra["maxrss_mb"]))
        rss_checks: list[RunResult] = []
        if "rss" in phases and args.rss_rows and args.rss_rows != args.rows:
            small = load(args.rss_rows)
            log(f"RSS pass: {small.total:,} rows; snapshot in {snapshot():.1f} s")
            q1 = run_qcluster(small, 1, slot, env, log_dir, live, nice=args.nice)
            rss_rows.append((small.total, q1.label, q1.extra["worker_peak_rss_mb"]))
            restore()
            drain = run_child("drain", small, slot, args.batch_size, env)
            rss_rows.append((small.total, drain.label, drain.extra["maxrss_mb"]))
            rss_checks += [q1, drain]
            if not (q1.ok and drain.ok):
                log("RSS pass: verification failed")

        plans = None
        if "plans" in phases:
            from bench.plans import plans_phase

            log(f"restored in {restore():.1f} s; timing one group's statements in isolation")
            plans = plans_phase(slot, args.plans_group)

        latency = None
        if phases & {"pickup", "idle"}:
            from bench.latency import pickup_and_idle

            log(f"restored in {restore():.1f} s; pickup latency and idle cluster (2 workers)")
            latency = pickup_and_idle(
                base_slot=slot,
                env=env,
                log_dir=log_dir,
                live=live,
                stats=stats,
                samples=args.pickup_samples,
                phases=phases,
                nice=args.nice,
            )

        admission = None
        if "admission" in phases:
            log(f"admission test: 100 portfolios x {args.admission_properties} properties x every kind")
            admission = admission_phase(slot, args.admission_properties)

        code = code_version()
        report.print_header(ds, batch=args.batch_size, scope=scope, code=code)
        report.print_runs(
            "Throughput (seconds = trigger to drained for the pipeline, admission included"
            + (f"; fastest of {args.repeat} runs each):" if args.repeat > 1 else "):"),
            runs,
        )
        report.print_statements(runs + ([count_run] if count_run else []), method=stats.method)
        if count_run:
            report.print_counted(count_run, [r for r in runs if r.label.startswith("DELETE loop")])
        report.print_details(runs + ([count_run] if count_run else []))
        if args.write_docs and not nightly:
            report.write_docs(
                ROOT / "docs" / "benchmarks.md", rows=ds.total, batch=args.batch_size, runs=runs, code=code
            )
        report.print_rss(rss_rows)
        report.print_plans(plans)
        report.print_latency(latency)
        report.print_admission(admission)
        report.print_targets(runs + ([count_run] if count_run else []), admission, latency, shape=args.shape)
        if args.save:
            report.save_json(
                args.save,
                shape=args.shape,
                code=code,
                ds=ds,
                runs=runs + ([count_run] if count_run else []),
                rss=rss_rows,
                latency=latency,
                plans=plans,
                admission=admission,
                method=stats.method,
            )
        failed = [r.label for r in runs + rss_checks + ([count_run] if count_run else []) if not r.ok]
        if failed:
            print(f"\nVERIFICATION FAILED: {', '.join(failed)}")
            sys.exit(1)
    finally:
        watch.stop()
        for cluster in list(live):
            cluster.stop()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: S110 - best effort before the server goes away
            pass
        if pg is None and os.environ.get("DATABASE_URL"):  # someone else's server: drop our snapshot
            try:
                drop_database(os.environ["DATABASE_URL"], pristine_name())
            except Exception as exc:
                log(f"could not drop the snapshot database: {exc}")
        if pg is not None and pg.running:
            pg.stop()
            log("PostgreSQL stopped and removed")
        if broker_server is not None:
            broker_server.stop()
        if args.keep_logs:
            log(f"qcluster logs kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
