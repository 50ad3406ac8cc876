"""Chaos run: drain a sweep through real workers while things break, and recover.

PostgreSQL (a throwaway cluster), two ``qcluster`` clusters — ``default``
deletes, ``purge`` purges attachments — draining a sweep while this script
SIGKILLs random worker-side processes, restarts PostgreSQL once, and has the
document store answer 429s and 500s for a while.

The clusters are supervised exactly as ``docs/deploy/`` ships it
(``chaos.supervise``, reading the units): ``Restart=always``; every
``OnUnitActiveSec`` the liveness unit's ``manage.py cleanup_health
--liveness``, whose failure restarts the cluster with the unit's stop
procedure (SIGTERM to the main process, SIGKILL to the group after
``TimeoutStopSec``). The run itself never dispatches, never restarts a
cluster on its own judgement and never touches the database while it drains:
no manual action. A worker killed while it holds one of django-q2's shared
queue locks wedges its cluster; the liveness check is what finds it.

Afterwards it checks and prints:

1. every eligible record is deleted or accounted for in an open dead letter;
2. no held record was deleted;
3. no operation id is twice in the ledger;
4. the ledger's deleted-row total equals the records actually gone;
5. no job is left leased past its lease expiry;
6. no purge was applied twice for one idempotency key, and no held record's
   file was purged;
7. no process of a stopped cluster survived its stop procedure;
8. every wedge was detected and recovered within 60 s of the cluster's last
   progress (the figures: detection, restart, first progress again).

Exit status 1 on any breach. Sizes: ``--ci`` (what ``.ci/run`` runs: a few
minutes), the default (larger), ``--full`` (the goal: 20 SIGKILLs and a
PostgreSQL restart during a drain of 1,000,000 eligible rows; ~15 minutes).
Usage::

    .venv/bin/python chaos/run.py [--ci | --full] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts chaos/ on the path; harness/ lives at the root.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chaos.supervise import Supervised, heartbeat_host  # noqa: E402
from harness.ports import free_port  # noqa: E402
from harness.postgres import Cluster, ClusterError, create_database  # noqa: E402
from harness.procs import stat_fields  # noqa: E402

PY = sys.executable
RECOVERY_GOAL_SECONDS = 60.0
# The liveness threshold for this short-turn workload (production default: 120 s):
# just above the floor the settings allow, 2 x CLEANUP_SLICE_SECONDS +
# CLEANUP_HEARTBEAT_SECONDS = 15 s with the defaults (a turn asleep for rate
# tokens may last two slices: cleanup_ops.execution.leases.TOKEN_SLEEP_STRETCH).
STALE_SECONDS = 16

SIZES: dict[str, dict[str, object]] = {
    # records: --records-per-property of seed_demo (the first portfolio gets more)
    "ci": {
        "portfolios": 5,
        "properties": 3,
        "records": 300,
        "attachments": 0.2,
        "kills": 4,
        "timeout": 300,
        "pg_restart_after": 8,
        "batch": 40,
        "slice_batches": 3,
    },
    "default": {
        "portfolios": 12,
        "properties": 6,
        "records": 1500,
        "attachments": 0.2,
        "kills": 8,
        "timeout": 900,
        "pg_restart_after": 8,
        "batch": 40,
        "slice_batches": 3,
    },
    # ~1.82M rows of which ~1.03M are eligible (past the cutoff, not running or open, not held).
    "full": {
        "portfolios": 20,
        "properties": 5,
        "records": 9600,
        "attachments": 0.002,
        "kills": 20,
        "timeout": 3000,
        "pg_restart_after": 25,
        "batch": 200,
        "slice_batches": 5,
    },
}


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


def last_progress(instance: str) -> datetime | None:
    """The cluster's heartbeat (what the liveness check reads), for the recovery figure."""
    from django.db import DatabaseError, connections

    from cleanup_ops.models import WorkerHeartbeat

    try:
        return (
            WorkerHeartbeat.objects.filter(host=heartbeat_host(), cluster=instance)
            .values_list("last_progress_at", flat=True)
            .first()
        )
    except DatabaseError:
        connections.close_all()
        return None


def waiting_messages(queue: str) -> int | None:
    """Unfetched messages in a queue: a wedged cluster leaves them there."""
    from django.db import DatabaseError, connections

    from cleanup_ops.dispatch import broker_backlog

    try:
        return broker_backlog(queue=queue or None)
    except DatabaseError:
        connections.close_all()
        return None


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ci", action="store_true", help="small variant for CI (a few minutes)")
    mode.add_argument(
        "--full", action="store_true", help="the goal: 20 SIGKILLs and a PostgreSQL restart, 1,000,000 rows"
    )
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10000)
    args = parser.parse_args()
    # Stopped from outside (TERM, or INT even where a shell ignores it): clean up all the same.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    rng = random.Random(args.seed)
    size = SIZES["ci" if args.ci else "full" if args.full else "default"]
    log(f"seed {args.seed}, size {size}")
    try:
        pg = Cluster(prefix="chaos-pg.")
    except ClusterError as exc:
        raise SystemExit(f"chaos: {exc} (apt-get install postgresql)") from exc
    store = None
    supervised: list[Supervised] = []
    stop_supervising = threading.Event()
    supervisors: list[threading.Thread] = []

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
            "CLEANUP_BATCH_SIZE": str(size["batch"]),
            "CLEANUP_SLICE_BATCHES": str(size["slice_batches"]),
            "CLEANUP_BACKOFF_BASE_SECONDS": "1",
            "CLEANUP_BACKOFF_CAP_SECONDS": "8",
            "CLEANUP_MAX_ATTEMPTS": "12",
            "CLEANUP_PORTFOLIO_MAX_LEASES": "2",
            "CLEANUP_LIVENESS_STALE_SECONDS": str(STALE_SECONDS),
            # The seeded database's empty monthly table partitions (2015 on) are
            # dropped by the sweep back to back: paced at the 2 s floor they would
            # hold the sweep for minutes, and no application's plans are at stake.
            "CLEANUP_TABLE_PARTITION_PAUSE_SECONDS": "0",
            "LOG_LEVEL": "ERROR",
        }
        # The documented setup: the schema, then django-q2's status cache table.
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "createcachetable")
        store = subprocess.Popen(
            [PY, "-m", "docstore", "--port", str(store_port), "--db", str(pg.dir / "docstore.sqlite3"), "--rate", "0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        seeding = time.monotonic()
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
        manage(env, "seed_attachments", "--fraction", str(size["attachments"]), "--seed", str(args.seed))
        log(f"seeded in {time.monotonic() - seeding:.0f} s")

        # Django in this process, for the before/after picture (read only while it drains).
        os.environ.update(env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        import django

        django.setup()
        from django.db import connections

        from chaos.checks import Result, checks, drain_figures, open_jobs, snapshot_before

        before = snapshot_before()
        log(f"before: {before.summary()}")
        out = json.loads(manage(env, "cleanup_sweep", "--json").strip().splitlines()[-1])
        log(f"sweep {out['key']}: {out['jobs_admitted']} jobs admitted")

        def supervise(instance: str) -> Supervised:
            return Supervised(
                instance,
                env,
                cwd=ROOT,
                python=PY,
                log=log,
                last_progress=last_progress,
                waiting_messages=waiting_messages,
            )

        supervised = [supervise("default"), supervise("purge")]
        units = supervised[0].units
        log(
            f"supervision from docs/deploy: liveness {units.liveness_interval:g} s after the previous check "
            f"(stale after {STALE_SECONDS} s), stop grace {units.stop_grace:g} s, "
            f"restart delay {units.restart_delay:g} s"
        )
        supervisors = [unit.run(stop_supervising) for unit in supervised]
        deadline = time.monotonic() + float(size["timeout"])
        kills_during_drain, pg_restarted, faults = 0, False, 0
        killed: set[int] = set()
        next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
        started = time.monotonic()
        remaining = -1
        while time.monotonic() < deadline:
            time.sleep(0.25)
            elapsed = time.monotonic() - started
            if kills_during_drain < int(size["kills"]) and time.monotonic() >= next_kill and remaining != 0:
                # The sentinel's children: workers, and the pusher and monitor it
                # reincarnates. The sentinel itself is the cluster's supervisor.
                # Live ones only: a killed process stays a zombie until its parent reaps it,
                # and a signal to a zombie succeeds without killing anything.
                victims = [
                    pid
                    for unit in supervised
                    for pid in unit.cluster.worker_side_pids()
                    if pid not in killed and (stat_fields(pid) or ["Z"])[0] != "Z"
                ]
                if victims:
                    victim = rng.choice(victims)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        killed.add(victim)
                        kills_during_drain += 1
                        log(f"SIGKILL worker-side process {victim} ({kills_during_drain}/{size['kills']})")
                    except ProcessLookupError:
                        pass
                next_kill = time.monotonic() + rng.uniform(1.0, 3.0)
            if not pg_restarted and elapsed > float(size["pg_restart_after"]):
                log("restarting PostgreSQL")
                connections.close_all()
                pg.restart()
                pg_restarted = True
            if faults == 0 and elapsed > 4:
                docstore_faults(store_port, {"status": 429, "retry_after": "2", "count": 25})
                log("document store: 25 x 429 Retry-After: 2")
                faults = 1
            elif faults == 1 and elapsed > 14:
                docstore_faults(store_port, {"status": 500, "count": 25})
                log("document store: 25 x 500")
                faults = 2
            try:
                remaining = open_jobs()
            except Exception:  # the database may be restarting
                connections.close_all()
                remaining = -1
                continue
            if kills_during_drain >= int(size["kills"]) and pg_restarted and faults == 2 and remaining == 0:
                break
        else:
            log("timed out waiting for the drain")
        drain_seconds = time.monotonic() - started
        log(f"drained in {drain_seconds:.1f} s")
        stop_supervising.set()
        for thread in supervisors:
            thread.join()
        for unit in supervised:  # systemctl stop: the unit's procedure; nothing may survive it
            left = unit.shutdown()
            log(f"stopped qcluster@{unit.instance}: {len(left)} processes survived")
        for unit in supervised:  # nothing may still write while the checks read
            unit.kill_everything()
        connections.close_all()

        results = checks(before, store_requests=docstore_requests(store_port))
        stops = [left for unit in supervised for left in unit.stop_survivors]
        survivors = sum(len(left) for left in stops)
        results.append(
            Result(
                "no process of a stopped cluster survived",
                survivors == 0,
                f"{len(stops)} stops (wedge restarts, exits, the final stop), {survivors} processes survived",
            )
        )
        wedges = [wedge for unit in supervised for wedge in unit.wedges]
        late = [w for w in wedges if w.total_seconds is None or w.total_seconds > RECOVERY_GOAL_SECONDS]
        results.append(
            Result(
                f"every wedge detected and recovered within {RECOVERY_GOAL_SECONDS:g} s",
                not late,
                f"{len(wedges)} wedges, {len(late)} not recovered in time",
            )
        )
        figures = drain_figures(before)
        print("", flush=True)
        print("Figures", flush=True)
        print(
            f"  rows: {figures['rows']:,} in the tables, {figures['eligible']:,} eligible; "
            f"{figures['deleted']:,} deleted, {figures['in_dead_letters']:,} in open dead letters, "
            f"{figures['held']:,} held and kept",
            flush=True,
        )
        print(
            f"  drain: {drain_seconds:.0f} s with {kills_during_drain} SIGKILLs of worker-side processes, "
            f"{int(pg_restarted)} PostgreSQL restart, 25 x 429 and 25 x 500 from the document store",
            flush=True,
        )
        for unit in supervised:
            print(
                f"  qcluster@{unit.instance}: {unit.checks} liveness checks, {len(unit.wedges)} wedges restarted, "
                f"{unit.exits} exits restarted (Restart=always)",
                flush=True,
            )
        for n, wedge in enumerate(wedges, 1):
            total = f"{wedge.total_seconds:.1f} s" if wedge.total_seconds is not None else "never"
            recovery = f"{wedge.recovery_seconds:.1f} s" if wedge.recovery_seconds is not None else "never"
            stopped = f"{wedge.restarted_at - wedge.detected_at:.1f} s" if wedge.restarted_at else "never"
            print(
                f"  wedge {n} (qcluster@{wedge.instance}): detected {wedge.stuck_seconds:.1f} s into it (no progress "
                f"for {wedge.quiet_seconds:.1f} s, work it could take waiting {wedge.due_waiting_seconds:.1f} s; "
                f"{wedge.waiting_messages} messages waiting unfetched: "
                f"{'its queue was not consumed' if wedge.waiting_messages else 'nothing was sent to it'}), "
                f"stopped and started again in {stopped}, "
                f"progress again {recovery} after detection; from the start of the wedge to progress again: {total}; "
                f"{len(wedge.survivors)} survivors",
                flush=True,
            )
        print("  manual actions: none (no dispatch, no restart but the liveness unit's)", flush=True)
        print("", flush=True)
        failed = [r for r in results if not r.ok]
        for r in results:
            print(f"{'PASS' if r.ok else 'FAIL'}  {r.name}: {r.detail}", flush=True)
        if args.full:
            goal = kills_during_drain >= 20 and pg_restarted and figures["eligible"] >= 1_000_000 and not failed
            print(
                f"GOAL {'MET' if goal else 'NOT MET'}: {kills_during_drain} SIGKILLs and "
                f"{int(pg_restarted)} PostgreSQL restart during a {figures['eligible']:,}-row drain with no manual "
                f"action; every eligible row deleted or in a dead letter, nothing wrong, "
                f"{len(wedges)} wedges each detected and recovered within {RECOVERY_GOAL_SECONDS:g} s",
                flush=True,
            )
        print(f"chaos: {len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
        return 1 if failed else 0
    finally:
        stop_supervising.set()
        for thread in supervisors:
            thread.join(timeout=60)
        for unit in supervised:
            unit.kill_everything()
        if store is not None:
            store.terminate()
            store.wait(timeout=10)
        pg.stop()


if __name__ == "__main__":
    sys.exit(main())
