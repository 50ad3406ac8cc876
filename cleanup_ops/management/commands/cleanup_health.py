from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.health import cluster_identity, cluster_liveness, health_readiness


class Command(BaseCommand):
    help = (
        "Health checks for supervisors: --liveness (this host's worker cluster is not wedged), "
        "--readiness (database reachable, migrations applied). Exits 1 when a check fails."
    )
    # Run by supervisors every few seconds: the system checks would triple its cost.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--liveness",
            action="store_true",
            help="fail when due work this host's cluster (CLEANUP_CLUSTER_NAME) could take has waited "
            "--stale-seconds and the cluster made no progress for as long",
        )
        parser.add_argument("--readiness", action="store_true", help="fail unless the database is ready")
        parser.add_argument(
            "--stale-seconds",
            type=float,
            default=None,
            help="liveness threshold (default: CLEANUP_LIVENESS_STALE_SECONDS)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: object, **options: object) -> None:
        if not options["liveness"] and not options["readiness"]:
            raise CommandError("give --liveness, --readiness or both")
        stale = options["stale_seconds"]
        if stale is not None and not (isinstance(stale, float) and stale > 0):
            raise CommandError(f"--stale-seconds: must be a positive number of seconds, got {stale}")
        reports = []
        if options["readiness"]:
            reports.append(health_readiness())
        if options["liveness"]:
            host, cluster = cluster_identity()
            reports.append(cluster_liveness(host=host, cluster=cluster, stale_seconds=stale))
        ok = all(report.ok for report in reports)
        if options["json"]:
            self.stdout.write(json.dumps({"ok": ok, "checks": [report.as_dict() for report in reports]}))
        else:
            for report in reports:
                self.stdout.write(f"{report.check}: {'ok' if report.ok else 'FAILED'}: {report.detail}")
        if not ok:
            raise SystemExit(1)
