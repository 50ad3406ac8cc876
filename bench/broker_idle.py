#!/usr/bin/env python
"""What an idle cluster costs PostgreSQL, per broker: transactions per second.

For each broker (``--brokers``, default all four) on a fresh throwaway PostgreSQL
and, for Redis, SQS and RabbitMQ, a throwaway server on loopback
(``harness/brokers.py``): migrate, start the clusters as deployed — the delete
cluster (2 workers) and the purge cluster (``Q_CLUSTER_NAME=retention-purge``,
2 workers) — with nothing due, wait ``--warm`` seconds (PostgreSQL flushes an
idle backend's counters up to 10 s late, so the window must start in steady
state), then read ``pg_stat_database.xact_commit`` (and ``tup_returned``) for the
database twice, ``--seconds`` apart. The two reads are this script's only
transactions on that database and are subtracted. ``--clusters 1`` measures the
delete cluster alone.

    .venv/bin/python bench/broker_idle.py [--brokers orm,redis] [--seconds 30] [--json FILE]
"""

# ruff: noqa: E402 - the harness imports need the repository root on sys.path first

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.brokers import BrokerServer, broker_env
from harness.postgres import Cluster, create_database
from harness.qcluster import QCluster

PY = sys.executable


def log(message: str) -> None:
    print(f"[broker_idle {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def counters(url: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback, tup_returned FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]), int(row[1])


def measure(kind: str, *, seconds: float, warm: float, clusters: int) -> dict[str, object]:
    pg = Cluster(prefix="broker-idle-pg.")
    server = BrokerServer(kind) if kind != "orm" else None
    started: list[QCluster] = []
    try:
        url = pg.start()
        create_database(url)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("Q_")},
            "DATABASE_URL": url,
            "SECRET_KEY": "broker-idle-bench-secret-key-0123456789-0123456789",
            "DEBUG": "false",
            "LOG_LEVEL": "ERROR",
            "Q_WORKERS": "2",
            "Q_PURGE_WORKERS": "2",
            **broker_env(kind, server.start() if server else {}),
        }
        for command in (["migrate", "--noinput", "-v", "0"], ["createcachetable"]):
            subprocess.run([PY, "manage.py", *command], cwd=ROOT, env=env, check=True)  # noqa: S603
        started.append(QCluster({**env, "CLEANUP_CLUSTER_NAME": "delete"}, cwd=ROOT, python=PY, log=log))
        if clusters > 1:
            purge_env = {**env, "Q_CLUSTER_NAME": "retention-purge", "CLEANUP_CLUSTER_NAME": "purge"}
            started.append(QCluster(purge_env, cwd=ROOT, python=PY, log=log))
        time.sleep(warm)
        if any(c.poll() is not None for c in started):
            raise RuntimeError(f"{kind}: a qcluster exited during the warm-up")
        (x0, t0), at0 = counters(url), time.monotonic()
        time.sleep(seconds)
        (x1, t1), at1 = counters(url), time.monotonic()
        elapsed = at1 - at0
        # Our own first read is counted by the second: one transaction.
        xacts = x1 - x0 - 1
        return {
            "broker": kind,
            "clusters": clusters,
            "seconds": round(elapsed, 1),
            "transactions": xacts,
            "transactions_per_s": round(xacts / elapsed, 2),
            "rows_read_per_s": round((t1 - t0) / elapsed, 1),
        }
    finally:
        for cluster in started:
            cluster.stop(grace=20)
        if server:
            server.stop()
        pg.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="orm,redis,sqs,rabbitmq")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warm", type=float, default=15.0)
    parser.add_argument("--clusters", type=int, choices=[1, 2], default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = []
    for kind in args.brokers.split(","):
        log(f"{kind}: {args.clusters} cluster(s), warm-up {args.warm:g} s, measuring {args.seconds:g} s")
        result = measure(kind, seconds=args.seconds, warm=args.warm, clusters=args.clusters)
        log(f"{kind}: {result['transactions_per_s']} transactions/s, {result['rows_read_per_s']} rows read/s")
        results.append(result)
    print(f"Idle clusters ({args.clusters}, 2 workers each, nothing due), PostgreSQL per second:")
    print(f"  {'broker':<10} {'transactions/s':>15} {'rows read/s':>12}")
    for r in results:
        print(f"  {r['broker']:<10} {r['transactions_per_s']:>15} {r['rows_read_per_s']:>12}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
