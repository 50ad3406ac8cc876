"""Chaos run: drain a sweep through real workers while things break.

PostgreSQL (a throwaway cluster), ``qcluster`` with two workers draining a
sweep, while this script SIGKILLs random worker processes several times,
restarts PostgreSQL once, and has the document store answer 429s and 500s for
a while. Afterwards it checks and prints:

1. every eligible record is deleted or accounted for in an open dead letter;
2. no held record was deleted;
3. no operation id is twice in the ledger;
4. the ledger's deleted-row total equals the records actually gone;
5. no job is left leased past its lease expiry;
6. no purge was applied twice for one idempotency key, and no held record's
   file was purged.

Exit status 1 on any breach. ``--ci`` is the small variant ``.ci/run`` runs
(a few minutes); the default is larger. Usage::

    .venv/bin/python chaos/run.py [--ci] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts chaos/ on the path; harness/ lives at the root.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.ports import free_port  # noqa: E402
from harness.postgres import Cluster, ClusterError, create_database  # noqa: E402
from harness.qcluster import QCluster  # noqa: E402

PY = sys.executable
STALL_SECONDS = 30


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"chaos: manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def docstore_faults(port: int, faults: dict[str, object] | None) -> None:
    url = f"http://127.0.0.1:{port}/_admin/faults"
    data = json.dumps(faults).encode() if faults else None
    request = urllib.request.Request(url, data=data, method="POST" if faults else "DELETE")
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request, timeout=5).read()


def docstore_requests(port: int) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_admin/requests", timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="small variant for CI (a few minutes)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    size = (
        {"portfolios": 5, "properties": 3, "records": 300, "kills": 4, "timeout": 300}
        if args.ci
        else {"portfolios": 12, "properties": 6, "records": 1500, "kills": 8, "timeout": 900}
    )
    log(f"seed {args.seed}, size {size}")
    try:
        pg = Cluster(prefix="chaos-pg.")
    except ClusterError as exc:
        raise SystemExit(f"chaos: {exc} (apt-get install postgresql)") from exc
    store = cluster = None
    clusters: list[QCluster] = []  # every qcluster started: whatever they leave behind is killed

    def start_cluster() -> QCluster:
        qc = QCluster(env, cwd=ROOT, python=PY, log=log)
        clusters.append(qc)
        return qc

    def start_purge_cluster() -> QCluster:
        # Purge jobs have a queue and a cluster of their own (Q_PURGE_CLUSTER, docs/deploy/brokers.md).
        purge_env = {**env, "Q_CLUSTER_NAME": env.get("Q_PURGE_CLUSTER", "retention-purge")}
        qc = QCluster({**purge_env, "CLEANUP_CLUSTER_NAME": "purge"}, cwd=ROOT, python=PY, log=log)
        clusters.append(qc)
        return qc

    try:
        db_url = pg.start()
        create_database(db_url)
        store_port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "SECRET_KEY": "chaos-run-secret-key-not-for-production-0123456789",
            "DEBUG": "false",
            "DOCSTORE_URL": f"http://127.0.0.1:{store_port}",
            "Q_WORKERS": "2",
            "CLEANUP_LEASE_SECONDS": "10",
            "DOCSTORE_CONNECT_TIMEOUT": "1",
            "DOCSTORE_READ_TIMEOUT": "3",
            "CLEANUP_BATCH_SIZE": "40",
            "CLEANUP_SLICE_BATCHES": "3",
            "CLEANUP_BACKOFF_BASE_SECONDS": "1",
            "CLEANUP_BACKOFF_CAP_SECONDS": "8",
            "CLEANUP_MAX_ATTEMPTS": "12",
            "CLEANUP_PORTFOLIO_MAX_LEASES": "2",
            "LOG_LEVEL": "ERROR",
        }
        manage(env, "migrate", "--noinput", "-v", "0")
        store = subprocess.Popen(
            [PY, "-m", "docstore", "--port", str(store_port), "--db", str(pg.dir / "docstore.sqlite3"), "--rate", "0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        manage(
            env,
            "seed_demo",
            "--portfolios",
            str(size["portfolios"]),
            "--properties-per-portfolio",
            str(size["properties"]),
            "--records-per-property",
            str(size["records"]),
            "--seed",
            str(args.seed),
        )
        manage(env, "seed_attachments", "--fraction", "0.2", "--seed", str(args.seed))

        # Django in this process, for the before/after picture.
        os.environ.update(env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from chaos.checks import checks, snapshot_before

        before = snapshot_before()
        log(f"before: {before.summary()}")
        out = json.loads(manage(env, "cleanup_sweep", "--json").strip().splitlines()[-1])
        log(f"sweep {out['key']}: {out['jobs_admitted']} jobs admitted")

        cluster = start_cluster()
        purge_cluster = start_purge_cluster()
        deadline = time.monotonic() + size["timeout"]
        kills, restarted, faults = 0, False, 0
        last_progress: tuple[int, int] = (-1, -1)
        progress_at = time.monotonic()
        started = time.monotonic()
        from django.db import connections

        from chaos.checks import open_jobs, work_done

        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 3.0))
            elapsed = time.monotonic() - started
            if cluster.poll() is not None:
                # A supervisor (systemd, Kubernetes) restarts a dead cluster; so do we.
                log(f"qcluster exited ({cluster.returncode}); starting it again")
                cluster = start_cluster()
            if purge_cluster.poll() is not None:
                log(f"purge qcluster exited ({purge_cluster.returncode}); starting it again")
                purge_cluster = start_purge_cluster()
            if kills < size["kills"]:
                # The sentinel's children: workers, and the pusher and monitor it
                # reincarnates. The sentinel itself is the cluster's supervisor.
                victims = cluster.worker_side_pids()
                if victims:
                    victim = rng.choice(victims)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills += 1
                        log(f"SIGKILL worker-side process {victim} ({kills}/{size['kills']})")
                    except ProcessLookupError:
                        pass
            if not restarted and elapsed > 8:
                log("restarting PostgreSQL")
                connections.close_all()
                pg.restart()
                restarted = True
            if faults == 0 and elapsed > 4:
                docstore_faults(store_port, {"status": 429, "retry_after": "2", "count": 25})
                log("document store: 25 x 429 Retry-After: 2")
                faults = 1
            elif faults == 1 and elapsed > 14:
                docstore_faults(store_port, {"status": 500, "count": 25})
                log("document store: 25 x 500")
                faults = 2
            try:
                remaining, progress = open_jobs(), work_done()
            except Exception:  # the database may be restarting
                connections.close_all()
                continue
            if kills >= size["kills"] and restarted and faults == 2 and remaining == 0:
                break
            if progress != last_progress:
                last_progress, progress_at = progress, time.monotonic()
            elif remaining and time.monotonic() - progress_at > STALL_SECONDS:
                # A worker SIGKILLed while holding the cluster's shared task
                # queue can wedge the whole cluster (a multiprocessing limit);
                # in production a liveness check restarts it. So do we.
                log(f"no progress for {STALL_SECONDS} s with {remaining} open jobs: restarting qcluster")
                cluster.kill()
                cluster = start_cluster()
                time.sleep(3)
                # The restarted cluster's scheduler needs up to a minute before
                # the periodic dispatch runs; kick the dispatcher as an operator
                # would (messages the dead cluster had fetched stay locked).
                from cleanup_ops.dispatch import dispatch_due_jobs

                log(f"dispatched {dispatch_due_jobs()} due jobs")
                progress_at = time.monotonic()
        else:
            log("timed out waiting for the drain")
        log(f"drained in {time.monotonic() - started:.1f} s")
        cluster.stop(grace=60)
        for qc in clusters:  # nothing may still write while the checks read
            qc.kill()
        cluster = None
        connections.close_all()
        results = checks(before, store_requests=docstore_requests(store_port))
        failed = [r for r in results if not r.ok]
        for r in results:
            print(f"{'PASS' if r.ok else 'FAIL'}  {r.name}: {r.detail}", flush=True)
        print(f"chaos: {len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
        return 1 if failed else 0
    finally:
        for qc in clusters:
            qc.kill()
        if store is not None:
            store.terminate()
            store.wait(timeout=10)
        pg.stop()


if __name__ == "__main__":
    sys.exit(main())
