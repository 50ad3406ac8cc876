from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.downstream.purge import purge_summary
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.fleet import drain_until_idle
from cleanup_ops.progress import progress_bar
from cleanup_ops.selectors import drain_summary


class Command(BaseCommand):
    help = "Run due cleanup jobs in this process until none is due."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-seconds", type=float, default=0.0, help="also wait up to this long for jobs that are not yet due"
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="scaled-to-zero fleet: when nothing is due, wait for work and exit only once nothing has been "
            "due for CLEANUP_IDLE_EXIT_SECONDS (or --idle-seconds); SIGTERM ends it after the batch in flight",
        )
        parser.add_argument("--idle-seconds", type=float, default=None, help="with --until-idle: the idle time")
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["max_seconds"] < 0:
            raise CommandError("--max-seconds must be 0 or more")
        idle = options["idle_seconds"]
        if idle is not None and not (options["until_idle"] and isinstance(idle, float) and idle >= 1):
            raise CommandError(f"--idle-seconds: needs --until-idle and at least 1 second, got {idle}")
        if options["until_idle"] and options["max_seconds"]:
            raise CommandError("--max-seconds and --until-idle are two ways to wait: give one")
        started = time.monotonic()
        progress = None if options["json"] else progress_bar()
        extra: dict[str, object] = {}
        if options["until_idle"]:
            idle_run = drain_until_idle(idle_seconds=idle, progress=progress)
            slices = idle_run.slices
            extra = {
                "exit_reason": idle_run.exit_reason,
                "busy_seconds": round(idle_run.busy_seconds, 2),
                "idle_seconds": round(idle_run.idle_seconds, 2),
            }
        else:
            slices = cleanup_drain(max_seconds=options["max_seconds"], progress=progress).slices
        summary: dict[str, Any] = {
            **drain_summary(),
            "purges": purge_summary(),
            "slices": slices,
            "seconds": round(time.monotonic() - started, 2),
            **extra,
        }
        if options["json"]:
            self.stdout.write(json.dumps(summary))
            return
        self.stdout.write(f"Drained in {summary['seconds']} s ({slices} slices).")
        if extra:
            self.stdout.write(
                f"Exited ({extra['exit_reason']}) after {extra['busy_seconds']} s draining"
                f" and {extra['idle_seconds']} s waiting for work."
            )
        self.stdout.write("Records deleted per kind (kept because of legal holds):")
        for kind, figures in summary["per_record_kind"].items():
            self.stdout.write(f"  {kind:<20} {figures['deleted']:>8} deleted  {figures['held']:>6} kept (held)")
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(summary["jobs_by_outcome"].items())) or "none"
        states = ", ".join(f"{k}: {v}" for k, v in sorted(summary["jobs_by_state"].items())) or "none"
        self.stdout.write(f"Jobs by outcome: {outcomes}")
        self.stdout.write(f"Jobs by state: {states}")
        self.stdout.write(f"Ledger rows (proof of disposition): {summary['ledger_rows']}")
        purges = summary["purges"]
        purge_states = ", ".join(f"{k}: {v}" for k, v in purges["purge_jobs_by_state"].items() if v) or "none"
        self.stdout.write(
            f"Attachments purged from the document store: {purges['documents_purged']}"
            f" (already gone: {purges['documents_already_gone']}, invalid ids: {purges['documents_invalid_ids']},"
            f" set aside under a legal hold: {purges['documents_set_aside_under_hold']},"
            f" kept as still referenced: {purges['documents_still_referenced']})"
            f" from {purges['purge_requests']} purge requests; purge jobs by state: {purge_states}"
        )
