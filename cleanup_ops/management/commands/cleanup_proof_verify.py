from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.proof_verify import verify_file


class Command(BaseCommand):
    help = (
        "Recompute every operation id, job digest and the sweep digest of a proof export (JSON or CSV) "
        "from the file alone; exit 1 naming each job that differs. Reads no database."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="a proof export (console: sweep page, proof; API: /sweeps/<id>/proof/)")
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        report = verify_file(str(options["file"]))
        for problem in report.problems:
            self.stdout.write(problem)
        self.stdout.write(report.summary())
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {"ok": report.ok, "jobs": report.jobs, "operations": report.operations, "problems": report.problems}
                )
            )
        if not report.ok:
            raise CommandError("the proof does not verify", returncode=1)
