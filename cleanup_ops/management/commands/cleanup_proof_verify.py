from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.proof_verify import public_keys_read, verify_file


class Command(BaseCommand):
    help = (
        "Check a proof export's (JSON or CSV) Ed25519 signature under the given public keys, then recompute "
        "every operation id, job digest and the sweep digest from the file alone; exit 1 naming each field, "
        "digest or key that differs. Reads no database and no key of the platform's own."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="a proof export (console: sweep page, proof; API: /sweeps/<id>/proof/)")
        parser.add_argument(
            "--public-key",
            action="append",
            required=True,
            metavar="FILE",
            help="the published key set (JSON: /api/v1/proof-keys/ or manage.py cleanup_proof_key) "
            "or a PEM public key; repeat for several",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            keys = public_keys_read(list(options["public_key"]))
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        report = verify_file(str(options["file"]), keys=keys)
        for problem in report.problems:
            self.stdout.write(problem)
        self.stdout.write(report.summary())
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "ok": report.ok,
                        "key_id": report.key_id,
                        "jobs": report.jobs,
                        "operations": report.operations,
                        "problems": report.problems,
                    }
                )
            )
        if not report.ok:
            raise CommandError("the proof does not verify", returncode=1)
