"""SCHEDULE: a slot of the schedule becomes exactly one sweep.

``sweep_trigger`` is what cron (``cleanup_sweep``) and the HTTP trigger call.
The slot defaults to the latest time of ``CLEANUP_SCHEDULE`` that is not after
now; an operator may name an earlier one (never a future one). The sweep's key
``cleanup:<slot>`` is unique in the database: the loser of a concurrent
trigger gets an IntegrityError, reads the winner's sweep and reports
``created=False``. Either way the sweep is then handed to admission, which is
itself idempotent, so a second trigger of a slot whose admission crashed
completes it without duplicates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from cleanup_ops.admission import sweep_admit
from cleanup_ops.models import Sweep

SLOT_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::00)?Z$")


class SlotError(ValueError):
    """A slot the operator gave is malformed or in the future."""


def slot_parse(text: str, *, now: datetime | None = None) -> datetime:
    """``2026-08-21T02:00Z`` → an aware UTC datetime, minute-aligned, not in the future."""
    match = SLOT_RE.match(text.strip())
    if not match:
        raise SlotError(f"slot: expected a UTC minute like 2026-08-21T02:00Z, got {text!r}")
    try:
        slot = datetime(*(int(part) for part in match.groups()), tzinfo=UTC)
    except ValueError as exc:
        raise SlotError(f"slot: {text!r} is not a valid date and time ({exc})") from None
    now = now or timezone.now()
    if slot > now:
        raise SlotError(f"slot: {text!r} is in the future (now is {slot_format(now)})")
    return slot


def slot_format(slot: datetime) -> str:
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def slot_current(*, now: datetime | None = None, schedule: str | None = None) -> datetime:
    """The latest time of ``CLEANUP_SCHEDULE`` that is not after ``now``."""
    now = (now or timezone.now()).astimezone(UTC)
    # croniter's get_prev is strictly before its base; start one minute past
    # the current minute so a trigger at exactly 02:00 gets the 02:00 slot.
    base = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return croniter(schedule or settings.CLEANUP_SCHEDULE, base).get_prev(datetime).astimezone(UTC)


def sweep_key(slot: datetime) -> str:
    return f"cleanup:{slot_format(slot)}"


@dataclass
class SweepResult:
    sweep: Sweep
    created: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "sweep_id": self.sweep.pk,
            "key": self.sweep.key,
            "created": self.created,
            "status": self.sweep.status,
            "jobs_admitted": self.sweep.jobs_admitted,
            "carried_over": self.sweep.carried_over,
        }


def sweep_trigger(*, slot: datetime | None = None, now: datetime | None = None) -> SweepResult:
    """Create the sweep for ``slot`` (default: the current one) and admit its jobs.

    Idempotent per slot: a second call, sequential or concurrent, returns the
    existing sweep with ``created=False``.
    """
    now = now or timezone.now()
    slot = slot or slot_current(now=now)
    if slot > now:
        raise SlotError(f"slot: {slot_format(slot)} is in the future")
    key = sweep_key(slot)
    created = False
    sweep = Sweep.objects.filter(key=key).first()
    if sweep is None:
        try:
            with transaction.atomic():
                sweep = Sweep.objects.create(key=key, slot=slot)
            created = True
        except IntegrityError:
            # Another trigger of the same slot won the race.
            sweep = Sweep.objects.get(key=key)
    sweep_admit(sweep_id=sweep.pk, now=now)
    sweep.refresh_from_db()
    return SweepResult(sweep=sweep, created=created)
