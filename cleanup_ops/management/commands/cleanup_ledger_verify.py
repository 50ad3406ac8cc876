from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.ledger_chain import verify_chains
from retention.inputs import portfolio_key_argument


class Command(BaseCommand):
    help = (
        "Walk the ledger's hash chains (one per portfolio, one of table-partition drops), recompute every row's "
        "hash and link, and check each chain ends at its head; exit 1 naming the first row removed, altered or "
        "reordered, 0 with the counts otherwise (cleanup_ops.ledger_chain)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--portfolio", type=portfolio_key_argument, metavar="ID", help="that portfolio's chain only"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        report = verify_chains(portfolio_id=options["portfolio"])
        for problem in report.problems:
            self.stdout.write(problem)
        self.stdout.write(report.summary())
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "ok": report.ok,
                        "chains": report.chains,
                        "rows": report.rows,
                        "first_row": report.first_row,
                        "problems": report.problems,
                    }
                )
            )
        if not report.ok:
            raise CommandError(f"the ledger's chain is broken at row {report.first_row}", returncode=1)
