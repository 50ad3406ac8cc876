from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.models import Sweep
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import dead_letters_dismiss_bulk, dead_letters_redrive_bulk
from cleanup_ops.selectors import DeadLetterFilter
from retention.domain import portfolio_model
from retention.inputs import portfolio_key_argument


class Command(BaseCommand):
    help = "Redrive (or --dismiss) every open dead letter that matches the filters, with one reason."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--category", required=True, help=f"one of: {', '.join(FailureCategory.values)}")
        parser.add_argument("--portfolio", type=portfolio_key_argument, help="only this portfolio id")
        parser.add_argument("--sweep", help="only this sweep (id or key)")
        parser.add_argument("--reason", required=True, help="why (at least 10 characters); lands in the audit trail")
        parser.add_argument("--user", help="record the decision as this user (who needs the permission)")
        parser.add_argument("--dismiss", action="store_true", help="dismiss instead of redriving")
        parser.add_argument("--json", action="store_true", help="print one JSON object last")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["category"] not in FailureCategory.values:
            raise CommandError(f"--category: unknown category {options['category']!r}")
        if (
            options["portfolio"] is not None
            and not portfolio_model()._default_manager.filter(pk=options["portfolio"]).exists()
        ):
            raise CommandError(f"--portfolio: no portfolio with id {options['portfolio']}")
        sweep_id = None
        if options["sweep"]:
            lookup = {"pk": int(options["sweep"])} if options["sweep"].isdigit() else {"key": options["sweep"]}
            sweep_id = Sweep.objects.filter(**lookup).values_list("pk", flat=True).first()
            if sweep_id is None:
                raise CommandError(f"--sweep: no sweep {options['sweep']!r}")
        actor = None
        if options["user"]:
            users = get_user_model()._default_manager
            actor = users.filter(**{users.model.USERNAME_FIELD: options["user"]}).first()
            if actor is None:
                raise CommandError(f"--user: no user {options['user']!r}")
        letter_filter = DeadLetterFilter(
            category=options["category"], portfolio_id=options["portfolio"], sweep_id=sweep_id
        )
        failed: list[dict[str, object]] = []
        try:
            if options["dismiss"]:
                count, new_jobs = (
                    dead_letters_dismiss_bulk(actor=actor, reason=options["reason"], letter_filter=letter_filter),
                    [],
                )
            else:
                result = dead_letters_redrive_bulk(actor=actor, reason=options["reason"], letter_filter=letter_filter)
                new_jobs = [job.pk for job in result]
                failed = [
                    {"letter_id": f.letter_id, "error_class": f.error_class, "open_job_id": f.open_job_id}
                    for f in result.failed
                ]
                count = len(new_jobs)
        except ValidationError as exc:
            raise CommandError(f"--reason: {exc.message_dict['reason'][0]}") from None
        except PermissionDenied as exc:
            raise CommandError(f"--user: {exc}") from None
        verb = "dismissed" if options["dismiss"] else "redriven"
        if options["json"]:
            self.stdout.write(json.dumps({verb: count, "new_job_ids": new_jobs, "failed": failed}))
            return
        self.stdout.write(f"{count} dead letters {verb}." + (f" New jobs: {new_jobs}" if new_jobs else ""))
        for failure in failed:
            why = (
                f"its partition already has open job {failure['open_job_id']}"
                if failure["open_job_id"] is not None
                else failure["error_class"]
            )
            self.stderr.write(f"Dead letter {failure['letter_id']} could not be redriven ({why}); still open.")
