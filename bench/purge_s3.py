"""Purge on S3 (moto): the product's purge path with ``DeleteObjects`` against
one call per file, measured in the same run.

What it does: starts a throwaway PostgreSQL (unless ``DATABASE_URL`` is set:
then that database, which must be empty), moto's server and the counting
proxy of ``harness.s3``; points the demo's ``lease`` kind at an
``S3Storage`` alias (``"attachment": {"field": "document_id", "storage":
"contracts"}``); then, per mode, puts ``--files`` objects into a fresh
bucket (straight to moto, not counted), creates as many expired leases
naming them (S3-style keys with slashes), runs the sweep's delete jobs, and
times the purge alone (``cleanup_drain`` of the purge jobs): files per
second, S3 calls seen by the proxy, SQL statements this process ran. The
modes: ``STORAGE_PURGE_BATCH_SIZE=1000`` (DeleteObjects, up to 1,000 keys a
call) and ``STORAGE_PURGE_BATCH_SIZE=1`` (one call per file, the baseline).
Each run is verified: the bucket is empty and every file counted purged.

    .venv/bin/python bench/purge_s3.py --files 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import code_version, log
from harness.postgres import Cluster, ClusterError, create_database
from harness.s3 import S3Proxy, S3Server, s3_client, storage_options

MODES = (("DeleteObjects", 1000), ("one call per file", 1))


def _seed(*, mode: int, files: int, bucket: str, moto: str) -> tuple[Any, list[str]]:
    from django.contrib.auth.models import User

    from bench.dataset import make_user
    from properties.models import Lease, Portfolio, Property
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    manager = User.objects.filter(username="bench-manager").first() or make_user("bench-manager", "property_manager")
    reviewer = User.objects.filter(username="bench-reviewer").first() or make_user(
        "bench-reviewer", "compliance_reviewer"
    )
    portfolio = Portfolio.objects.create(name=f"S3 bench {mode}", slug=f"s3-bench-{mode}")
    prop = Property.objects.create(portfolio=portfolio, name=f"S3 bench {mode}")
    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=30, author=manager, reason="benchmark policy")
    policy_version_approve(version_id=version.pk, reviewer=reviewer, note="benchmark: seeded, approved")
    client = s3_client(moto)
    client.create_bucket(Bucket=bucket)
    keys = [f"leases/2024/{i % 12 + 1:02d}/signed-{mode}-{i:06d}.pdf" for i in range(files)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"%PDF-1.7 signed lease")
    ended = time.time() - 2 * 365 * 86400
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(ended, tz=UTC)
    Lease.objects.bulk_create(
        [
            Lease(
                portfolio=portfolio,
                property=prop,
                unit="1",
                tenant_name="T",
                started_on=at.date(),
                ended_at=at,
                document_id=key,
            )
            for key in keys
        ],
        batch_size=1000,
    )
    return portfolio, keys


def _run_mode(*, mode: int, label: str, batch: int, files: int, moto: str, proxy: S3Proxy) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection

    from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
    from cleanup_ops.models import CleanupJob, JobKind, JobState, PurgeRequest
    from cleanup_ops.schedule import slot_current, sweep_trigger
    from retention.registry import DEFAULT_RECORD_KINDS, registry_reload

    bucket = f"bench-contracts-{mode}"
    settings.STORAGES = {
        **settings.STORAGES,
        "contracts": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": storage_options(proxy.endpoint, bucket)},
    }
    settings.RETENTION_RECORD_KINDS = {
        **DEFAULT_RECORD_KINDS,
        "lease": {**DEFAULT_RECORD_KINDS["lease"], "attachment": {"field": "document_id", "storage": "contracts"}},
    }
    settings.STORAGE_PURGE_BATCH_SIZE = batch
    registry_reload()
    from django.core.files.storage import storages

    # The alias's options changed (a new bucket): Django's handler caches both.
    storages._storages = {}
    storages._backends = None
    storages.__dict__.pop("backends", None)
    # The reference guard of the lease table, now for <alias>:<key> references.
    from cleanup_ops.downstream.guard import guards_install

    guards_install()
    portfolio, _ = _seed(mode=mode, files=files, bucket=bucket, moto=moto)
    slot = slot_current() - timedelta(days=mode)
    sweep_trigger(slot=slot)
    for job in CleanupJob.objects.filter(job_kind=JobKind.DELETE, portfolio_id=portfolio.pk):
        while CleanupJob.objects.get(pk=job.pk).state not in (JobState.DONE, JobState.DEAD):
            job_run_slice(job_id=job.pk)
    proxy.reset()
    statements = 0

    def count(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    load_before = os.getloadavg()
    started = time.perf_counter()
    with connection.execute_wrapper(count):
        cleanup_drain()
    seconds = time.perf_counter() - started
    load_after = os.getloadavg()
    requests = PurgeRequest.objects.filter(portfolio_id=portfolio.pk)
    purged = sum(r.documents_purged for r in requests)
    left = s3_client(moto).list_objects_v2(Bucket=bucket).get("KeyCount", 0)
    if purged != files or left:
        raise SystemExit(f"bench: {label}: {purged} of {files} purged, {left} left in the bucket")
    return {
        "mode": label,
        "batch": batch,
        "files": files,
        "seconds": seconds,
        "files_per_second": files / seconds,
        "calls": dict(proxy.calls),
        "store_calls": sum(proxy.calls.values()),
        "statements": statements,
        "load": (load_before[0], load_after[0]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/purge_s3.py", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000, help="files per mode (default 2000)")
    args = parser.parse_args(argv)
    if args.files < 1:
        parser.error("--files: at least 1")
    pg = None
    try:
        if not os.environ.get("DATABASE_URL"):
            try:
                pg = Cluster(prefix="bench-s3-pg.")
            except ClusterError as exc:
                raise SystemExit(f"bench: no DATABASE_URL and {exc}") from exc
            os.environ["DATABASE_URL"] = pg.start()
            log(f"throwaway PostgreSQL ({pg.bin}) in {pg.dir}")
        create_database(os.environ["DATABASE_URL"])
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        os.environ.setdefault("SECRET_KEY", "bench-purge-s3-not-a-secret-0123456789abcdef")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        with S3Server() as moto, S3Proxy(moto.endpoint) as proxy:
            log(f"moto's server at {moto.endpoint}, counting proxy at {proxy.endpoint}")
            results = []
            for mode, (label, batch) in enumerate(MODES, start=1):
                log(f"{label}: {args.files} files")
                results.append(
                    _run_mode(mode=mode, label=label, batch=batch, files=args.files, moto=moto.endpoint, proxy=proxy)
                )
        print(f"code: {code_version()}  files per mode: {args.files}  cpus: {os.cpu_count()}")
        print(
            f"{'mode':<20} {'seconds':>8} {'files/s':>9} {'S3 calls':>9} {'SQL stmts':>10}  calls by operation  load 1m"
        )
        for r in results:
            ops = ", ".join(f"{k} {v}" for k, v in sorted(r["calls"].items()))
            print(
                f"{r['mode']:<20} {r['seconds']:>8.2f} {r['files_per_second']:>9.0f} {r['store_calls']:>9}"
                f" {r['statements']:>10}  {ops}  {r['load'][0]:.2f}->{r['load'][1]:.2f}"
            )
        base, batched = results[1], results[0]
        print(
            "DeleteObjects vs one call per file:"
            f" {batched['files_per_second'] / base['files_per_second']:.1f}x files/s,"
            f" {base['store_calls'] / max(1, batched['store_calls']):.0f}x fewer S3 calls,"
            f" {base['statements'] / max(1, batched['statements']):.1f}x fewer SQL statements"
        )
        return 0
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    sys.exit(main())
