from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from cleanup_ops.fleet import due_work_by_kind
from cleanup_ops.health import cluster_identity, cluster_liveness, health_readiness

# `--due` exit statuses, chosen for systemd's ExecCondition= (1-254 skip the
# unit quietly, 255 marks it failed) and for any shell `if`.
DUE_WORK = 0
NOTHING_DUE = 1
NOT_JUDGED = 255


class Command(BaseCommand):
    help = (
        "Health checks for supervisors: --liveness (this host's worker cluster is not wedged), "
        "--readiness (database reachable, migrations applied). Exits 1 when a check fails. "
        "--due (alone): exit 0 when work is due (start a worker), 1 when nothing is, "
        "255 when the database cannot tell."
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
            "--due",
            action="store_true",
            help="scaled-to-zero fleet: exit 0 when jobs are due or held by a live lease outside every pause "
            "(start a worker), 1 when none is, 255 when the database is unreachable; given alone",
        )
        parser.add_argument(
            "--stale-seconds",
            type=float,
            default=None,
            help="liveness threshold (default: CLEANUP_LIVENESS_STALE_SECONDS)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["due"]:
            if options["liveness"] or options["readiness"]:
                raise CommandError("--due is given alone: its exit status means 'start a worker', not 'healthy'")
            self.handle_due(as_json=bool(options["json"]))
            return
        if not options["liveness"] and not options["readiness"]:
            raise CommandError("give --liveness, --readiness or both (or --due alone)")
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

    def handle_due(self, *, as_json: bool) -> None:
        try:
            by_kind = due_work_by_kind()
        except DatabaseError as exc:
            detail = f"not judged: the database is unreachable ({type(exc).__name__})"
            self.stdout.write(json.dumps({"due": None, "detail": detail}) if as_json else f"due: {detail}")
            raise SystemExit(NOT_JUDGED) from None
        total = sum(by_kind.values())
        if as_json:
            self.stdout.write(json.dumps({"due": total > 0, "jobs": total, "jobs_by_kind": by_kind}))
        else:
            kinds = ", ".join(f"{kind}: {n}" for kind, n in by_kind.items())
            self.stdout.write(f"due: {'yes' if total else 'no'}: {total} jobs want a worker ({kinds})")
        if not total:
            raise SystemExit(NOTHING_DUE)
