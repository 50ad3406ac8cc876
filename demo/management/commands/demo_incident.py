"""``demo_incident``: stage an incident on the demo data (see ``demo.services.demo_incident_stage``)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.services import DEMO_PASSWORD, SeedError, demo_incident_stage


class Command(BaseCommand):
    help = (
        "After seed_demo and seed_attachments: pause a portfolio, make the document store reject deletes, "
        "trigger and drain a sweep, and print where to look in the console."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--max-seconds", type=float, default=60.0)

    def handle(self, *args: object, **options: object) -> None:
        if not settings.DOCSTORE_URL:
            raise CommandError("DOCSTORE_URL is not set: start the demo document store first (make demo-incident)")
        try:
            result = demo_incident_stage(docstore_url=settings.DOCSTORE_URL, max_seconds=float(options["max_seconds"]))
        except SeedError as exc:
            raise CommandError(str(exc)) from exc
        categories = ", ".join(f"{n} {c}" for c, n in sorted(result.categories.items())) or "none"
        base = "http://127.0.0.1:8000"
        self.stdout.write(
            "\n".join(
                [
                    f"Incident staged: {result.paused_portfolio} is paused"
                    f" ({result.sweep_key} is {result.sweep_status},"
                    f" {result.open_jobs} job(s) open); {result.dead_letters} open dead letter(s): {categories}.",
                    "",
                    "Where to look (DEBUG=true .venv/bin/python manage.py runserver; log in as operator,"
                    f" password {DEMO_PASSWORD}):",
                    f"  {base}/console/                 the forecast names the pause; no worker runs the open work",
                    f"  {base}/console/dead-letters/    the letters from the document store: redrive or dismiss",
                    f"  {base}/console/pauses/          resume the paused portfolio, with a reason",
                    f"  {base}/console/jobs/?state=pending   run a job now, or cancel it",
                    f"  {base}/console/workers/         no cluster yet: start one with manage.py qcluster",
                    "  manager-a (a customer's manager) lands on a page of what they may do",
                ]
            )
        )
