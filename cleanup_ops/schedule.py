"""SCHEDULE: a slot of the schedule becomes exactly one sweep.

``sweep_trigger`` is what cron (``cleanup_sweep``) and the HTTP trigger call.
The slot defaults to the latest time of ``CLEANUP_SCHEDULE`` that is not after
now; an operator may name an earlier one (never a future one). The sweep's key
``cleanup:<slot>`` is unique in the database: the loser of a concurrent
trigger gets an IntegrityError, reads the winner's sweep and reports
``created=False``. Either way the sweep is then handed to admission, which is
itself idempotent, so a second trigger of a slot whose admission crashed
completes it without duplicates.

A crash between a sweep's creation and its admission leaves it
``admitting``. ``sweeps_reconcile`` completes such sweeps whatever their
slot; every trigger runs it, and so does the dispatcher's periodic tick
(``cleanup_ops.tasks.dispatch``), which also marks drained a running sweep
whose last job finished without the sweep's status being recorded (a crash or
a database error right after the job's outcome).

Before admission, a trigger drops whole table partitions that no hold can
reach (``cleanup_ops.table_partitions``), so their rows are never candidates.

Each trigger also hands attachments that a purge set aside under a legal
hold, and whose hold has since been released, to a new purge job in the
triggered sweep (``downstream.purge.purge_requeue_released``).

Slots are bounded below by ``EARLIEST_SLOT``: a slot's cutoffs are the slot
minus up to ``MAX_RETENTION_DAYS`` (a century), which for an ancient slot
such as ``0001-01-02T00:00Z`` is not a representable date at all.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from cleanup_ops.admission import sweep_admit
from cleanup_ops.downstream.purge import purge_requeue_released
from cleanup_ops.execution.runner import worker_session_bound
from cleanup_ops.models import CleanupJob, Sweep, SweepStatus
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from cleanup_ops.table_partitions import TablePartitionsReport, table_partitions_drop

logger = logging.getLogger(__name__)

SLOT_RE = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})(?::00)?Z$")

# No slot before this: the system keeps nothing from before the epoch, and an
# earlier slot is a typo (its cutoffs, a century before it at most, must stay
# far inside what Python and the database can represent).
EARLIEST_SLOT = datetime(1970, 1, 1, tzinfo=UTC)


class SlotError(ValueError):
    """A slot the operator gave is malformed, in the future or before ``EARLIEST_SLOT``."""


def slot_check(slot: datetime, *, now: datetime) -> datetime:
    """``slot`` if it is neither in the future nor before ``EARLIEST_SLOT``; else a SlotError."""
    if slot > now:
        raise SlotError(f"slot: {slot_format(slot)!r} is in the future (now is {slot_format(now)})")
    if slot < EARLIEST_SLOT:
        raise SlotError(f"slot: {slot_format(slot)!r} is before the earliest slot {slot_format(EARLIEST_SLOT)}")
    return slot


def slot_parse(text: str, *, now: datetime | None = None) -> datetime:
    """``2026-08-21T02:00Z`` → an aware UTC datetime, minute-aligned, not in the future."""
    match = SLOT_RE.match(text.strip())
    if not match:
        raise SlotError(f"slot: expected a UTC minute like 2026-08-21T02:00Z, got {text!r}")
    try:
        year, month, day, hour, minute = (int(part) for part in match.groups())
        slot = datetime(year, month, day, hour, minute, tzinfo=UTC)
    except ValueError as exc:
        raise SlotError(f"slot: {text!r} is not a valid date and time ({exc})") from None
    return slot_check(slot, now=now or timezone.now())


def slot_format(slot: datetime) -> str:
    # Not strftime: its %Y drops the leading zeros of a year before 1000.
    at = slot.astimezone(UTC)
    return f"{at.year:04d}-{at.month:02d}-{at.day:02d}T{at.hour:02d}:{at.minute:02d}Z"


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
    purges_requeued: int = 0  # purge jobs for attachments whose hold was released
    # Whole table partitions dropped before admission (None: the sweep was already admitted).
    table_partitions: TablePartitionsReport | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "sweep_id": self.sweep.pk,
            "key": self.sweep.key,
            "created": self.created,
            "status": self.sweep.status,
            "jobs_admitted": self.sweep.jobs_admitted,
            "carried_over": self.sweep.carried_over,
            "purges_requeued": self.purges_requeued,
            "table_partitions": self.table_partitions.as_dict() if self.table_partitions else None,
        }


def sweep_trigger(*, slot: datetime | None = None, now: datetime | None = None) -> SweepResult:
    """Create the sweep for ``slot`` (default: the current one) and admit its jobs.

    Idempotent per slot: a second call, sequential or concurrent, returns the
    existing sweep with ``created=False``.
    """
    now = now or timezone.now()
    slot = slot_check(slot or slot_current(now=now), now=now)
    # The trigger takes scope and table locks (a drop) as a worker does: a
    # trigger that stalls inside a transaction gives them back after the same
    # bound (docs/architecture.md, invariant 18), whether cron's command or
    # the API's request runs it.
    worker_session_bound()
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
    # Whole table partitions out of every hold's reach go first, so their rows
    # are never a job's candidates (cleanup_ops.table_partitions).
    dropped = (
        table_partitions_drop(slot=slot, now=now, sweep_id=sweep.pk) if sweep.status == SweepStatus.ADMITTING else None
    )
    # Any other sweep a crash left admitting is completed first, in slot
    # order, so partitions go to the oldest sweep and later ones carry them over.
    sweeps_admit_stranded(now=now, exclude=sweep.pk)
    sweep_admit(sweep_id=sweep.pk, now=now)
    # Attachments set aside under a legal hold that has since been released
    # are purged as part of this sweep.
    requeued = purge_requeue_released(sweep=sweep, now=now)
    sweep.refresh_from_db()
    return SweepResult(sweep=sweep, created=created, purges_requeued=len(requeued), table_partitions=dropped)


@dataclass
class Reconciled:
    """What ``sweeps_reconcile`` repaired."""

    admitted: list[int]  # sweeps whose admission it completed
    drained: list[int]  # running sweeps it marked drained


def sweeps_admit_stranded(*, now: datetime, exclude: int | None = None) -> list[int]:
    """Complete the admission of every sweep still ``admitting`` (any slot).

    A sweep whose row another trigger holds locked is being admitted right
    now and is skipped rather than waited for; admission is idempotent, so
    completing one that was merely slow is harmless.
    """
    with transaction.atomic():
        stranded = Sweep.objects.select_for_update(skip_locked=True).filter(status=SweepStatus.ADMITTING)
        if exclude is not None:
            stranded = stranded.exclude(pk=exclude)
        ids = list(stranded.order_by("slot").values_list("pk", flat=True))
    for sweep_id in ids:
        sweep_admit(sweep_id=sweep_id, now=now)
        logger.warning("sweep %s: admission completed after a crash", sweep_id, extra={"sweep_id": sweep_id})
    return ids


def sweeps_reconcile(*, now: datetime | None = None) -> Reconciled:
    """The dispatcher tick's repairs: stranded admissions, and running sweeps
    with no open job left (their last job's outcome was recorded but the
    sweep's status was not) marked drained."""
    now = now or timezone.now()
    admitted = sweeps_admit_stranded(now=now)
    finished = list(
        Sweep.objects.filter(status=SweepStatus.RUNNING)
        .exclude(Exists(CleanupJob.objects.open().filter(sweep_id=OuterRef("pk"))))
        .values_list("pk", flat=True)
    )
    for sweep_id in finished:
        sweep_mark_drained_if_finished(sweep_id=sweep_id, now=now)
    drained = list(
        Sweep.objects.filter(pk__in=finished).exclude(status=SweepStatus.RUNNING).values_list("pk", flat=True)
    )
    return Reconciled(admitted=admitted, drained=drained)
