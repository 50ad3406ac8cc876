"""``seed_demo``: fill an empty database with deterministic demo data (see ``demo.services``)."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.progress import progress_bar
from demo.services import DEMO_PASSWORD, SeedError, demo_data_seed


class Command(BaseCommand):
    help = (
        "Fill an empty database with deterministic demo data, policies, holds, the platform's staff and, "
        "per customer (--customers), its own staff as members of its portfolios."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--portfolios", type=int, default=6)
        parser.add_argument("--properties-per-portfolio", type=int, default=4)
        parser.add_argument("--records-per-property", type=int, default=400)
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument(
            "--customers",
            type=int,
            default=1,
            help="customers the portfolios are dealt to (round-robin), each with its own staff; 1: user 'manager'",
        )

    def handle(self, *args: object, **options: object) -> None:
        started = time.monotonic()
        try:
            result = demo_data_seed(
                portfolios=options["portfolios"],
                properties_per_portfolio=options["properties_per_portfolio"],
                records_per_property=options["records_per_property"],
                seed=options["seed"],
                customers=options["customers"],
                progress=progress_bar(),
            )
        except SeedError as exc:
            raise CommandError(str(exc)) from None
        elapsed = time.monotonic() - started
        total = sum(result.records.values())
        self.stdout.write(
            f"Seeded {result.portfolios} portfolios, {result.properties} properties, {total} records "
            f"({', '.join(f'{k}: {v}' for k, v in result.records.items())}), {result.holds} legal holds "
            f"in {elapsed:.1f} s."
        )
        self.stdout.write(f"Demo users (password {DEMO_PASSWORD!r}, demo only): {', '.join(result.users)}")
        if len(result.customers) > 1:
            for letter, slugs in result.customers.items():
                self.stdout.write(
                    f"Customer {letter}: {', '.join(slugs)} (manager-{letter}, reviewer-{letter}, auditor-{letter})"
                )
