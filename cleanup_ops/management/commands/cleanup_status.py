from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from cleanup_ops.dispatch import broker_status
from cleanup_ops.selectors import pipeline_status


class Command(BaseCommand):
    help = "Jobs by state, oldest due job age, leases, rows deleted per sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        status = pipeline_status()
        # Through django-q2's broker interface (queue_size), whichever Q_BROKER is configured.
        status["broker"] = broker_status()
        if options["json"]:
            self.stdout.write(json.dumps(status))
            return
        states = ", ".join(f"{k}: {v}" for k, v in status["jobs_by_state"].items())
        self.stdout.write(f"Jobs: {states}")
        age = status["oldest_due_age_seconds"]
        self.stdout.write(f"Oldest due job: {'none due' if age is None else f'{age} s'}")
        self.stdout.write(f"Leases: {status['leased']} active, {status['expired_leases']} expired")
        self.stdout.write(f"Rows deleted: {status['rows_deleted_total']} in {status['ledger_rows']} ledger rows")
        self.stdout.write(f"Open dead letters: {status['dead_letters_open']}")
        queues = [
            f"{name} ({'/'.join(q['kinds'])}): "
            + (
                f"unreachable ({q['error']})"
                if q.get("error")
                else f"{q['waiting']} waiting of a window of {q['window']}"
            )
            for name, q in status["broker"]["queues"].items()
        ]
        self.stdout.write(f"Broker {status['broker']['broker']}: " + "; ".join(queues))
        for pause in status["paused"]:
            scope = f"portfolio {pause['portfolio_id']}" if pause["portfolio_id"] else "whole pipeline"
            self.stdout.write(f"PAUSED: {scope} ({pause['reason']})")
        self.stdout.write("Effective limits: " + ", ".join(f"{k}={v}" for k, v in status["limits"].items()))
        for sweep in status["sweeps"]:
            self.stdout.write(
                f"  {sweep['key']}: {sweep['status']}, {sweep['jobs_admitted']} jobs, "
                f"{sweep['carried_over']} carried over, {sweep['rows_deleted']} rows deleted"
            )
