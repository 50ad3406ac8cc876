#!/usr/bin/env python
"""Console and API latency with 100k jobs and 1M ledger rows on PostgreSQL.

Run from the repository root::

    .venv/bin/python bench/console.py [--jobs 100000] [--ledger 1000000] [--requests 40]

Starts a throwaway PostgreSQL (``harness/postgres.py``), bulk-loads sweeps,
jobs, ledger rows, dead letters, audit events and records with
``generate_series``, then requests each console page and list endpoint through
Django's full request stack (in-process client: middleware, auth, views,
templates, queries; no socket) and prints p50/p95/max in milliseconds and the
number of queries per page. Target: p95 under 150 ms for every page.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGES = [
    "/console/",
    "/console/?hours=168",
    "/console/sweeps/",
    "/console/sweeps/{sweep}/",
    "/console/jobs/",
    "/console/jobs/?state=dead",
    "/console/jobs/?sweep={sweep}&portfolio={portfolio}&kind=lease",
    "/console/jobs/{job}/",
    "/console/dead-letters/",
    "/console/dead-letters/{letter}/",
    "/console/dead-letters/all-matching/?operation=redrive",
    "/console/workers/",
    "/console/pauses/",
    "/console/portfolios/{portfolio}/",
    "/console/audit/",
    "/console/audit/?actor=bench-operator&action=dismissed",
    "/console/search/?q=P7",
    "/console/jobs/?q=timeout",
    "/console/dead-letters/?q=P7",
    "/console/jobs/all-matching/?operation=run_now&sweep={sweep}",
    "/api/v1/jobs/?state=done",
    "/api/v1/dead-letters/?status=open",
    "/api/v1/sweeps/",
    "/api/v1/metrics/",
    "/api/v1/docs/",
]


def load(jobs: int, ledger: int, *, spread_hours: int) -> int:
    from django.db import connection

    per_job = max(1, ledger // jobs)
    sweeps = 10
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO properties_portfolio (name, slug, created_at)"
            " SELECT 'P' || g, 'p-' || g, now() FROM generate_series(1, 100) g"
        )
        cur.execute(
            "INSERT INTO properties_property (portfolio_id, name)"
            " SELECT po.id, 'B' || g FROM properties_portfolio po, generate_series(1, 10) g"
        )
        cur.execute("SELECT min(id) FROM auth_user")
        (user_id,) = cur.fetchone()
        # One approved policy per portfolio and kind.
        for kind in ("lease", "maintenance_record", "tenant_activity"):
            cur.execute(
                "INSERT INTO retention_retentionpolicy (portfolio_id, record_kind, created_at)"
                " SELECT id, %s, now() FROM properties_portfolio",
                [kind],
            )
        cur.execute(
            "INSERT INTO retention_policyversion (policy_id, number, retention_days, enabled, status, author_id,"
            " reason, created_at, review_note) SELECT id, 1, CASE record_kind WHEN 'lease' THEN 730"
            " WHEN 'maintenance_record' THEN 365 ELSE 90 END, true, 'approved', %s, 'bench', now(), ''"
            " FROM retention_retentionpolicy",
            [user_id],
        )
        # 300k leases, 5% of them overdue (past the cutoff, not yet deleted).
        cur.execute(
            "INSERT INTO properties_lease (portfolio_id, property_id, unit, tenant_name, started_on, ended_at,"
            " document_id) SELECT p.portfolio_id, p.id, '1', 'T', now()::date,"
            " now() - (CASE WHEN g % 20 = 0 THEN 800 ELSE 100 END) * interval '1 day', ''"
            " FROM properties_property p, generate_series(1, 300) g"
        )
        cur.execute(
            "INSERT INTO cleanup_ops_sweep (key, slot, status, jobs_admitted, carried_over, created_at)"
            " SELECT 'cleanup:2026-11-' || lpad(g::text, 2, '0') || 'T02:00Z',"
            " timestamp '2026-11-01 02:00+00' + (g - 1) * interval '1 day', 'drained', %s, 0, now()"
            " FROM generate_series(1, %s) g",
            [jobs // sweeps, sweeps],
        )
        cur.execute("SELECT id FROM retention_policyversion LIMIT 1")
        (version_id,) = cur.fetchone()
        cur.execute(
            "INSERT INTO cleanup_ops_cleanupjob (sweep_id, key, job_kind, portfolio_id, property_id, record_kind,"
            " policy_version_id, cutoff, state, outcome, available_at, lease_owner, leases, attempt,"
            " last_error_category, last_error_class, cursor, batches, rows_deleted, rows_held, created_at,"
            " first_leased_at, finished_at)"
            " SELECT s.id, s.key || ':' || g, 'delete', 1 + g %% 100, g %% 1000 + 1, 'lease', %s, now(),"
            # Open jobs only in the newest sweep: the database holds one open
            # job per partition (``job_one_open_per_partition``).
            " CASE WHEN g %% 50 = 0 THEN 'dead' WHEN g %% 97 = 0 AND s.id = (SELECT max(id) FROM"
            " cleanup_ops_sweep) THEN 'pending' ELSE 'done' END,"
            " CASE WHEN g %% 50 = 0 THEN '' ELSE 'deleted' END, now() - interval '1 hour', '', 1,"
            " CASE WHEN g %% 10 = 0 THEN 2 ELSE 0 END, CASE WHEN g %% 10 = 0 THEN 'timeout' ELSE '' END, '',"
            " g, %s, %s, 0, now() - interval '2 hours', now() - interval '2 hours' + (g %% 60) * interval '1 second',"
            " now() - interval '1 hour'"
            " FROM cleanup_ops_sweep s, generate_series(1, %s) g",
            [version_id, per_job, per_job * 1000, jobs // sweeps],
        )
        cur.execute(
            "INSERT INTO cleanup_ops_ledgerentry (operation_id, job_id, portfolio_id, property_id, record_kind,"
            " policy_version_id, cutoff, after_id, last_id, batch_limit, candidates, rows_deleted, applied_at)"
            " SELECT md5(j.id || ':' || g) || md5(g || ':' || j.id), j.id, j.portfolio_id, j.property_id,"
            " 'lease', %s, now(), g * 1000, g * 1000 + 999, 1000, 1000, 1000,"
            " now() - (random() * %s) * interval '1 hour'"
            " FROM cleanup_ops_cleanupjob j, generate_series(1, %s) g",
            [version_id, spread_hours, per_job],
        )
        cur.execute(
            "INSERT INTO cleanup_ops_deadletter (job_id, category, error_class, attempts, first_seen_at,"
            " last_seen_at, portfolio_id, property_id, record_kind, policy_version_id, sweep_id, status,"
            " resolution_reason) SELECT id, 'retry_budget_exhausted', 'TimeoutError', 5, now(), now()"
            " - (id % 72) * interval '1 hour', portfolio_id, property_id, record_kind, policy_version_id,"
            " sweep_id, CASE WHEN id % 3 = 0 THEN 'open' ELSE 'dismissed' END, ''"
            " FROM cleanup_ops_cleanupjob WHERE state = 'dead'"
        )
        cur.execute(
            "INSERT INTO retention_auditevent (actor_id, action, object_type, object_id, reason, details, created_at)"
            " SELECT %s, 'dead_letter.dismissed', 'dead_letter', g::text, 'bench', '{}'::jsonb,"
            " now() - g * interval '1 second' FROM generate_series(1, 100000) g",
            [user_id],
        )
        # The newest sweep is still running (its pending jobs are open): the
        # console forecasts its drain. Two worker clusters hold 50 live leases
        # and 10 expired ones; ten portfolios are paused.
        cur.execute("SELECT max(id) FROM cleanup_ops_sweep")
        (latest,) = cur.fetchone()
        cur.execute(
            "UPDATE cleanup_ops_sweep SET status = 'running', finished_at = NULL,"
            " admitted_at = now() - interval '2 hours' WHERE id = %s",
            [latest],
        )
        cur.execute(
            "INSERT INTO cleanup_ops_workerheartbeat (host, cluster, pid, started_at, last_progress_at, turns,"
            " jobs_leased, rows_deleted, updated_at) SELECT 'bench-' || g, 'default', 100 + g,"
            " now() - interval '3 hours', now() - interval '5 seconds', 1000, 5000, 1000000, now()"
            " FROM generate_series(1, 2) g"
        )
        cur.execute(
            "UPDATE cleanup_ops_cleanupjob SET state = 'leased',"
            " lease_owner = 'bench-' || (1 + id %% 2) || ':' || (id %% 7), lease_token = md5(id::text)::uuid,"
            " lease_expires_at = now() + CASE WHEN id %% 6 = 0 THEN -1 ELSE 1 END"
            " * interval '1 minute' WHERE id IN (SELECT id FROM cleanup_ops_cleanupjob WHERE sweep_id = %s"
            " AND state = 'pending' ORDER BY id LIMIT 60)",
            [latest],
        )
        cur.execute(
            "INSERT INTO cleanup_ops_pipelinepause (portfolio_id, reason, paused_at, resume_reason)"
            " SELECT id, 'bench pause', now(), '' FROM properties_portfolio ORDER BY id LIMIT 10"
        )
        cur.execute("VACUUM ANALYZE")
        return latest


def page_ids(sweep: int) -> dict[str, int]:
    """Ids for the pages about one object: a dead letter of the running sweep,
    its job (which has ledger rows) and its portfolio."""
    from cleanup_ops.models import DeadLetter

    letter = DeadLetter.objects.filter(sweep_id=sweep).order_by("-id").first() or DeadLetter.objects.latest("id")
    return {"sweep": sweep, "job": letter.job_id, "letter": letter.pk, "portfolio": letter.portfolio_id}


def best_of(fn, n: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description="console/API latency benchmark")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--ledger", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument(
        "--spread-hours", type=int, default=30 * 24, help="ledger rows are spread over this many past hours"
    )
    parser.add_argument("--keep", action="store_true", help="leave the database running (prints its URL) and wait")
    args = parser.parse_args()

    from harness.postgres import Cluster, ClusterError, create_database

    try:
        pg = Cluster(prefix="bench-console-pg.")
    except ClusterError as exc:
        raise SystemExit(f"bench: {exc}") from exc
    try:
        url = pg.start()
        create_database(url)
        os.environ.update(
            {
                "DATABASE_URL": url,
                "SECRET_KEY": "bench-secret-key-not-for-production-0123456789",
                "SECURE_SSL_REDIRECT": "false",
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "LOG_LEVEL": "ERROR",
            }
        )
        import django

        django.setup()
        from django.contrib.auth.models import Group, User
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        call_command("migrate", verbosity=0)
        user = User.objects.create_user("bench-operator", password="x" * 12)
        user.groups.add(Group.objects.get(name="operator"))
        started = time.monotonic()
        sweep = load(args.jobs, args.ledger, spread_hours=args.spread_hours)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT (SELECT count(*) FROM cleanup_ops_cleanupjob), (SELECT count(*) FROM cleanup_ops_ledgerentry)"
            )
            jobs, ledger = cur.fetchone()
        print(f"loaded {jobs} jobs, {ledger} ledger rows in {time.monotonic() - started:.1f} s")
        from django.utils import timezone

        from cleanup_ops.console_selectors import overview as figures

        now = timezone.now()
        current = figures.current_sweep()
        parts = {
            "jobs_overview (with sweep progress)": lambda: figures.jobs_overview(now=now, sweep=current),
            "throughput": lambda: figures.throughput(now=now),
            "retries_by_category": lambda: figures.retries_by_category(sweep=current),
            "dead_letter_figures": lambda: figures.dead_letter_figures(now=now),
            "portfolio_fairness": lambda: figures.portfolio_fairness(now=now, sweep=current),
            "retention_debt": lambda: figures.retention_debt(now=now),
        }
        print("overview parts (ms, best of 5): " + ", ".join(f"{name} {best_of(fn):.1f}" for name, fn in parts.items()))
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        print(f"{'page':<58} {'queries':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        worst = 0.0
        ids = page_ids(sweep)
        for template in PAGES:
            path = template.format(**ids)
            for _ in range(3):
                assert client.get(path).status_code == 200, path
            counted = []

            def count(execute, sql, params, many, context, counted=counted):  # type: ignore[no-untyped-def]
                counted.append(sql)
                return execute(sql, params, many, context)

            with connection.execute_wrapper(count):
                client.get(path)
            samples = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                client.get(path)
                samples.append((time.perf_counter() - t0) * 1000)
            samples.sort()
            p95 = samples[max(0, int(len(samples) * 0.95) - 1)]
            worst = max(worst, p95)
            median = statistics.median(samples)
            print(f"{path:<58} {len(counted):>7} {median:>8.1f} {p95:>8.1f} {samples[-1]:>8.1f}")
        print(f"worst p95: {worst:.1f} ms (target < 150 ms): {'met' if worst < 150 else 'MISSED'}")
        if args.keep:
            print(f"database kept at {os.environ['DATABASE_URL']}; Ctrl-C to stop", flush=True)
            time.sleep(3600)
        return 0
    finally:
        pg.stop()


if __name__ == "__main__":
    sys.exit(main())
