from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.downstream.purge import purge_summary
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.selectors import drain_summary
from config.progress import progress_bar


class Command(BaseCommand):
    help = "Run due cleanup jobs in this process until none is due."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-seconds", type=float, default=0.0, help="also wait up to this long for jobs that are not yet due"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: object, **options: object) -> None:
        if options["max_seconds"] < 0:
            raise CommandError("--max-seconds must be 0 or more")
        started = time.monotonic()
        run = cleanup_drain(max_seconds=options["max_seconds"], progress=None if options["json"] else progress_bar())
        summary = {
            **drain_summary(),
            "purges": purge_summary(),
            "slices": run.slices,
            "seconds": round(time.monotonic() - started, 2),
        }
        if options["json"]:
            self.stdout.write(json.dumps(summary))
            return
        self.stdout.write(f"Drained in {summary['seconds']} s ({run.slices} slices).")
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
