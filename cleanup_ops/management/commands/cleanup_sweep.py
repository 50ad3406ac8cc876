from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from cleanup_ops.admission import sweep_preview
from cleanup_ops.schedule import SlotError, slot_current, slot_format, slot_parse, sweep_trigger
from retention.domain import key_json
from retention.inputs import portfolio_key_argument


class PreviewRow(TypedDict):
    """One partition of a dry run, as --json prints it."""

    portfolio_id: int | str  # a key as JSON carries it: a UUID's text
    record_kind: str
    retention_days: int
    cutoff: str
    eligible: int
    held: int
    unreachable: NotRequired[int]  # rows a property path cannot reach (NULL on the way)


class Command(BaseCommand):
    help = "The cron entry: create this slot's sweep (once) and admit its jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--slot", help="UTC minute, e.g. 2026-08-21T02:00Z (default: the current slot)")
        parser.add_argument("--dry-run", action="store_true", help="print eligible and held counts; write nothing")
        parser.add_argument("--portfolio", type=portfolio_key_argument, help="with --dry-run: only this portfolio id")
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        try:
            slot = slot_parse(options["slot"], now=now) if options["slot"] else slot_current(now=now)
        except SlotError as exc:
            raise CommandError(f"--{exc}") from None
        if options["portfolio"] is not None and not options["dry_run"]:
            raise CommandError("--portfolio only narrows a --dry-run; a sweep always covers every portfolio")
        if options["dry_run"]:
            self._dry_run(slot, options)
            return
        result = sweep_trigger(slot=slot, now=now)
        data = result.as_dict()
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        verb = "created" if result.created else "already existed"
        self.stdout.write(
            f"Sweep {data['key']} (id {data['sweep_id']}) {verb}: {data['jobs_admitted']} jobs admitted, "
            f"{data['carried_over']} partitions carried over from earlier sweeps, status {data['status']}."
        )
        if result.table_partitions is not None:
            self.stdout.write(result.table_partitions.summary())

    def _dry_run(self, slot: datetime, options: dict[str, Any]) -> None:
        try:
            preview = sweep_preview(slot=slot, portfolio_id=options["portfolio"])
        except ValueError as exc:
            raise CommandError(f"--{exc}") from None
        rows: list[PreviewRow] = [
            {
                "portfolio_id": key_json(r.portfolio_id),
                "record_kind": r.record_kind,
                "retention_days": r.retention_days,
                "cutoff": r.cutoff.isoformat(),
                "eligible": r.eligible,
                "held": r.held,
                "unreachable": r.unreachable,
            }
            for r in preview.rows
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"slot": slot_format(slot), "dry_run": True, "partitions": rows}))
            return
        self.stdout.write(f"Dry run for slot {slot_format(slot)} (nothing written):")
        self.stdout.write(f"{'portfolio':>9}  {'record kind':<20} {'days':>6} {'eligible':>9} {'held':>6}")
        for r in rows:
            line = f"{r['portfolio_id']!s:>9}  {r['record_kind']:<20} {r['retention_days']:>6}"
            self.stdout.write(f"{line} {r['eligible']:>9} {r['held']:>6}")
        self.stdout.write(
            f"Total: {sum(r['eligible'] for r in rows)} eligible, {sum(r['held'] for r in rows)} held by legal holds."
        )
        for r in rows:
            if r["unreachable"]:
                # A one-hop path that is NULL: in no partition, so no job will ever delete these.
                self.stdout.write(
                    f"Portfolio {r['portfolio_id']}, {r['record_kind']}: {r['unreachable']} rows past the cutoff "
                    "belong to no property (their path is NULL) and will not be deleted (check retention.W009)."
                )
