"""``demo_incident``: stage an incident on the demo data (see ``demo.services.demo_incident_stage``).

It prints where to look and a recovery that works when followed literally
(issue 30, item 2): the demo's document store is stopped when ``make
demo-incident`` ends, and the redriven letters are purge jobs, which only a
cluster of the purge queue runs, and which call the store. So the recovery
starts the store again on a fixed port (``--docstore-port``, the same data
file), a delete cluster, and a purge cluster with ``Q_CLUSTER_NAME`` and
``DOCSTORE_URL`` set (the two get distinct cluster names by default), then
resumes the portfolio and redrives the letters from the console.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.console_selectors.workers import start_command
from demo.services import DEMO_PASSWORD, SeedError, demo_incident_stage

PYTHON = ".venv/bin/python"


def recovery_steps(*, paused_portfolio: str, letters: int, docstore_db: str, docstore_port: int) -> list[str]:
    """The printed recovery: each command on a line of its own, indented by
    seven spaces, so that it can be copied (and a test can run it) as it is."""
    store_url = f"http://127.0.0.1:{docstore_port}"
    purge = start_command(settings.Q_PURGE_CLUSTER).replace("<the document store>", store_url)
    purge = purge.replace("python manage.py", f"{PYTHON} manage.py")
    delete = start_command(settings.Q_CLUSTER["name"]).replace("python manage.py", f"{PYTHON} manage.py")
    steps = [
        "To recover, step by step (each command in a terminal of its own, in this directory):",
        "  1. Start the document store again (the demo stopped it; same data file):",
        f"       {PYTHON} -m docstore --port {docstore_port} --db {docstore_db}",
        "  2. Start the console:",
        f"       DEBUG=true {PYTHON} manage.py runserver",
        "  3. Start a delete cluster (the main queue):",
        f"       DEBUG=true {delete}",
    ]
    if settings.Q_PURGE_CLUSTER != settings.Q_CLUSTER["name"]:
        steps += [
            "  4. Start a purge cluster: the redriven letters are purge jobs, which only a cluster of the purge",
            "     queue runs, and which call the document store (without DOCSTORE_URL they fail again):",
            f"       DEBUG=true {purge}",
            '     Its name defaults to "purge" (the delete cluster\'s to "default"): one heartbeat each.',
        ]
    steps += [
        f"  5. In the console, as operator (password {DEMO_PASSWORD}):",
        f"     /console/pauses/          resume {paused_portfolio}, with a reason",
        f"     /console/dead-letters/    redrive all {letters} matching, with a reason",
        "     /console/                 nothing open once the clusters are done",
    ]
    return steps


class Command(BaseCommand):
    help = (
        "After seed_demo and seed_attachments: pause a portfolio, make the document store reject deletes, "
        "trigger and drain a sweep, and print where to look in the console and how to recover."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--max-seconds", type=float, default=60.0)
        parser.add_argument(
            "--docstore-db", default="var/docstore.sqlite3", help="the store's data file, for the printed recovery"
        )
        parser.add_argument(
            "--docstore-port", type=int, default=8765, help="the port the printed recovery starts the store on"
        )

    def handle(self, *args: object, **options: object) -> None:
        if not settings.DOCSTORE_URL:
            raise CommandError("DOCSTORE_URL is not set: start the demo document store first (make demo-incident)")
        port = int(options["docstore_port"])
        if not 1 <= port <= 65535:
            raise CommandError(f"--docstore-port: expected 1 to 65535, got {port}")
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
                    f"  {base}/console/workers/         no cluster yet: start one for each queue (below)",
                    "  manager-a (a customer's manager) lands on a page of what they may do",
                    "",
                    *recovery_steps(
                        paused_portfolio=result.paused_portfolio,
                        letters=result.dead_letters,
                        docstore_db=str(options["docstore_db"]),
                        docstore_port=port,
                    ),
                ]
            )
        )
