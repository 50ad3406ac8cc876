"""Schedule and admission: the first two boundaries of the pipeline.

Schedule: ``sweep_trigger`` turns a slot into exactly one ``Sweep`` row (the
key is unique in the database; the loser of a race reports the existing
sweep). Admission: ``sweep_admit`` locks the sweep row, and while the sweep is
still ``admitting`` inserts one job per partition with rows past its cutoff
(``ON CONFLICT DO NOTHING`` on the job key), so a crashed admission is
completed by the next trigger of the same slot without duplicates. Jobs reach
django-q2 only after the admitting transaction commits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from croniter import croniter
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from cleanup_ops.models import OPEN_STATES, CleanupJob, DeadLetter, JobKind, PipelinePause, Sweep
from properties.models import Portfolio, Property
from retention.eligibility import count_expired_and_held, db_datetime
from retention.models import PolicyVersion
from retention.registry import get_spec
from retention.services import audit_event_record, require_text

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


def job_key(sweep: Sweep, portfolio_id: int, property_id: int, record_kind: str) -> str:
    return f"{sweep.key}:{portfolio_id}:{property_id}:{record_kind}"


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


@dataclass
class Partition:
    portfolio_id: int
    property_id: int
    record_kind: str
    version: PolicyVersion
    cutoff: datetime


def _active_versions() -> list[PolicyVersion]:
    return list(
        PolicyVersion.objects.filter(status=PolicyVersion.Status.APPROVED, enabled=True)
        .select_related("policy")
        .order_by("policy__portfolio_id", "policy__record_kind")
    )


def partitions_due(*, slot: datetime) -> list[Partition]:
    """Every (portfolio, property, kind) with at least one row past its cutoff.

    Held rows count: such a partition still gets a job, which then ends with
    the outcome ``held`` and so shows up in the sweep's report.
    """
    partitions: list[Partition] = []
    property_table = Property._meta.db_table
    with connection.cursor() as cursor:
        for version in _active_versions():
            kind = version.policy.record_kind
            spec = get_spec(kind)
            cutoff = slot - timedelta(days=version.retention_days)
            cursor.execute(
                f"SELECT p.id FROM {property_table} p WHERE p.portfolio_id = %s AND EXISTS ("
                f"SELECT 1 FROM {spec.table} r WHERE r.property_id = p.id AND r.{spec.timestamp_column} < %s)"
                " ORDER BY p.id",
                [version.policy.portfolio_id, db_datetime(cutoff)],
            )
            partitions.extend(
                Partition(version.policy.portfolio_id, property_id, kind, version, cutoff)
                for (property_id,) in cursor.fetchall()
            )
    return partitions


def sweep_admit(*, sweep_id: int, now: datetime | None = None) -> int:
    """Admit the sweep's jobs if it is still admitting; returns jobs inserted now."""
    now = now or timezone.now()
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep_id)
        if sweep.status != Sweep.Status.ADMITTING:
            return 0
        open_elsewhere = set(
            # Only delete jobs: an open purge job (say, waiting on the document
            # store's Retry-After) must not hold back the partition's next delete.
            CleanupJob.objects.filter(state__in=OPEN_STATES, kind=JobKind.DELETE)
            .exclude(sweep_id=sweep.pk)
            .values_list("portfolio_id", "property_id", "record_kind")
        )
        jobs, carried_over = [], 0
        for part in partitions_due(slot=sweep.slot):
            if (part.portfolio_id, part.property_id, part.record_kind) in open_elsewhere:
                carried_over += 1
                continue
            jobs.append(
                CleanupJob(
                    sweep=sweep,
                    key=job_key(sweep, part.portfolio_id, part.property_id, part.record_kind),
                    portfolio_id=part.portfolio_id,
                    property_id=part.property_id,
                    record_kind=part.record_kind,
                    policy_version=part.version,
                    cutoff=part.cutoff,
                    available_at=now,
                )
            )
        before = CleanupJob.objects.filter(sweep=sweep).count()
        CleanupJob.objects.bulk_create(jobs, batch_size=2000, ignore_conflicts=True)
        admitted = CleanupJob.objects.filter(sweep=sweep).count()
        sweep.jobs_admitted = admitted
        sweep.carried_over = carried_over
        sweep.status = Sweep.Status.RUNNING if admitted else Sweep.Status.DRAINED
        sweep.admitted_at = now
        sweep.finished_at = None if admitted else now
        sweep.save(update_fields=["jobs_admitted", "carried_over", "status", "admitted_at", "finished_at"])
        transaction.on_commit(_wake_dispatcher)
    return admitted - before


def _wake_dispatcher() -> None:
    from cleanup_ops.dispatch import dispatch_due_jobs

    dispatch_due_jobs()


@dataclass
class DryRunRow:
    portfolio_id: int
    record_kind: str
    retention_days: int
    cutoff: datetime
    expired: int
    held: int

    @property
    def eligible(self) -> int:
        return self.expired - self.held


@dataclass
class DryRun:
    slot: datetime
    rows: list[DryRunRow] = field(default_factory=list)


def sweep_preview(*, slot: datetime, portfolio_id: int | None = None) -> DryRun:
    """Per portfolio and record kind: rows eligible and rows held. Writes nothing."""
    if portfolio_id is not None and not Portfolio.objects.filter(pk=portfolio_id).exists():
        raise ValueError(f"portfolio: no portfolio with id {portfolio_id}")
    result = DryRun(slot=slot)
    for version in _active_versions():
        if portfolio_id is not None and version.policy.portfolio_id != portfolio_id:
            continue
        cutoff = slot - timedelta(days=version.retention_days)
        expired, held = count_expired_and_held(
            version.policy.record_kind, cutoff=cutoff, portfolio_id=version.policy.portfolio_id
        )
        result.rows.append(
            DryRunRow(
                version.policy.portfolio_id, version.policy.record_kind, version.retention_days, cutoff, expired, held
            )
        )
    return result


def sweep_refresh_status(*, sweep_id: int, now: datetime | None = None) -> None:
    """Mark a running sweep drained once none of its jobs is open."""
    now = now or timezone.now()
    if CleanupJob.objects.filter(sweep_id=sweep_id, state__in=OPEN_STATES).exists():
        return
    has_dead = CleanupJob.objects.filter(sweep_id=sweep_id, state=CleanupJob.State.DEAD).exists()
    Sweep.objects.filter(pk=sweep_id, status=Sweep.Status.RUNNING).update(
        status=Sweep.Status.DRAINED_WITH_DEAD_LETTERS if has_dead else Sweep.Status.DRAINED, finished_at=now
    )


# --- Recovery: dead letters and pauses --------------------------------------

MIN_REASON_LENGTH = 10


class DeadLetterNotOpen(Exception):
    """Redrive or dismiss of a letter that an operator already resolved."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(f"dead letter {letter.pk} is {letter.status}, not open")
        self.letter = letter


def _operator_reason(reason: str | None) -> str:
    return require_text(reason or "", field="reason", min_length=MIN_REASON_LENGTH)


def _require_perm(actor: AbstractBaseUser | None, perm: str) -> None:
    # actor None: a trusted command-line operator (see cleanup_redrive).
    if actor is not None and not actor.has_perm(perm):
        raise PermissionDenied(f"You do not have the {perm} permission.")


def _redrive_one(letter: DeadLetter, *, actor: AbstractBaseUser | None, reason: str, now: datetime) -> CleanupJob:
    old = letter.job
    n = CleanupJob.objects.filter(redrive_of=old).count() + 1
    job = CleanupJob.objects.create(
        sweep_id=old.sweep_id,
        key=f"{old.key}:redrive:{n}",
        portfolio_id=old.portfolio_id,
        property_id=old.property_id,
        record_kind=old.record_kind,
        policy_version_id=old.policy_version_id,
        cutoff=old.cutoff,
        # The old cursor is a safe start: the ledger replays anything already applied.
        cursor=old.cursor,
        available_at=now,
        redrive_of=old,
    )
    letter.mark_resolved(status=DeadLetter.Status.REDRIVEN, by=actor, at=now, reason=reason, redrive_job=job)
    audit_event_record(
        actor=actor,
        action="dead_letter.redriven",
        object_type="dead_letter",
        object_id=letter.pk,
        reason=reason,
        details={"old_job_id": old.pk, "new_job_id": job.pk, "category": letter.category, "sweep_id": old.sweep_id},
    )
    return job


def _dismiss_one(letter: DeadLetter, *, actor: AbstractBaseUser | None, reason: str, now: datetime) -> None:
    letter.mark_resolved(status=DeadLetter.Status.DISMISSED, by=actor, at=now, reason=reason)
    audit_event_record(
        actor=actor,
        action="dead_letter.dismissed",
        object_type="dead_letter",
        object_id=letter.pk,
        reason=reason,
        details={"job_id": letter.job_id, "category": letter.category, "sweep_id": letter.sweep_id},
    )


def _reopen_sweeps(sweep_ids: set[int]) -> None:
    Sweep.objects.filter(pk__in=sweep_ids).exclude(status=Sweep.Status.ADMITTING).update(
        status=Sweep.Status.RUNNING, finished_at=None
    )


def dead_letter_redrive(*, letter_id: int, actor: AbstractBaseUser | None, reason: str) -> CleanupJob:
    """Try a dead letter again as a *new* job (new id, key ``<old key>:redrive:<n>``)."""
    _require_perm(actor, "cleanup_ops.redrive_deadletter")
    reason = _operator_reason(reason)
    now = timezone.now()
    with transaction.atomic():
        letter = DeadLetter.objects.select_for_update().select_related("job").get(pk=letter_id)
        if letter.status != DeadLetter.Status.OPEN:
            raise DeadLetterNotOpen(letter)
        job = _redrive_one(letter, actor=actor, reason=reason, now=now)
        _reopen_sweeps({job.sweep_id})
        transaction.on_commit(_wake_dispatcher)
    return job


def dead_letter_dismiss(*, letter_id: int, actor: AbstractBaseUser | None, reason: str) -> DeadLetter:
    _require_perm(actor, "cleanup_ops.dismiss_deadletter")
    reason = _operator_reason(reason)
    with transaction.atomic():
        letter = DeadLetter.objects.select_for_update().get(pk=letter_id)
        if letter.status != DeadLetter.Status.OPEN:
            raise DeadLetterNotOpen(letter)
        _dismiss_one(letter, actor=actor, reason=reason, now=timezone.now())
    return letter


def _open_letters(  # type: ignore[no-untyped-def]
    *, category: str | None, portfolio_id: int | None, sweep_id: int | None, letter_ids: list[int] | None = None
):
    qs = DeadLetter.objects.select_for_update().select_related("job").filter(status=DeadLetter.Status.OPEN)
    if letter_ids is not None:
        qs = qs.filter(pk__in=letter_ids)
    if category:
        qs = qs.filter(category=category)
    if portfolio_id is not None:
        qs = qs.filter(portfolio_id=portfolio_id)
    if sweep_id is not None:
        qs = qs.filter(sweep_id=sweep_id)
    return qs.order_by("id")


def dead_letters_redrive_bulk(
    *,
    actor: AbstractBaseUser | None,
    reason: str,
    category: str | None = None,
    portfolio_id: int | None = None,
    sweep_id: int | None = None,
    letter_ids: list[int] | None = None,
) -> list[CleanupJob]:
    """Redrive every open letter matching the filters (and ``letter_ids`` when
    given), in one transaction, one audit event each. Letters no longer open
    are skipped: the caller sees which ones from the returned jobs."""
    _require_perm(actor, "cleanup_ops.redrive_deadletter")
    reason = _operator_reason(reason)
    now = timezone.now()
    with transaction.atomic():
        jobs = [
            _redrive_one(letter, actor=actor, reason=reason, now=now)
            for letter in _open_letters(
                category=category, portfolio_id=portfolio_id, sweep_id=sweep_id, letter_ids=letter_ids
            )
        ]
        _reopen_sweeps({job.sweep_id for job in jobs})
        if jobs:
            transaction.on_commit(_wake_dispatcher)
    return jobs


def dead_letters_dismiss_bulk(
    *,
    actor: AbstractBaseUser | None,
    reason: str,
    category: str | None = None,
    portfolio_id: int | None = None,
    sweep_id: int | None = None,
    letter_ids: list[int] | None = None,
) -> int:
    _require_perm(actor, "cleanup_ops.dismiss_deadletter")
    reason = _operator_reason(reason)
    now = timezone.now()
    with transaction.atomic():
        letters = list(
            _open_letters(category=category, portfolio_id=portfolio_id, sweep_id=sweep_id, letter_ids=letter_ids)
        )
        for letter in letters:
            _dismiss_one(letter, actor=actor, reason=reason, now=now)
    return len(letters)


def pipeline_pause(*, actor: AbstractBaseUser | None, reason: str, portfolio_id: int | None = None) -> PipelinePause:
    """Stop new leases (everywhere, or for one portfolio); in-flight slices finish."""
    _require_perm(actor, "cleanup_ops.add_pipelinepause")
    reason = _operator_reason(reason)
    if portfolio_id is not None and not Portfolio.objects.filter(pk=portfolio_id).exists():
        raise ValidationError({"portfolio": f"no portfolio with id {portfolio_id}"})
    try:
        with transaction.atomic():
            # The partial unique constraint guards this on PostgreSQL; SQLite
            # cannot express it (NULLS NOT DISTINCT), so check here as well.
            if PipelinePause.objects.filter(resumed_at__isnull=True, portfolio_id=portfolio_id).exists():
                raise IntegrityError("already paused")
            pause = PipelinePause.objects.create(
                portfolio_id=portfolio_id, reason=reason, paused_by=actor, paused_at=timezone.now()
            )
            audit_event_record(
                actor=actor,
                action="pipeline.paused",
                object_type="portfolio" if portfolio_id else "pipeline",
                object_id=portfolio_id or "all",
                reason=reason,
                details={"pause_id": pause.pk},
            )
    except IntegrityError:
        raise ValidationError({"portfolio": "already paused"}) from None
    return pause


def pipeline_resume(*, actor: AbstractBaseUser | None, reason: str, portfolio_id: int | None = None) -> PipelinePause:
    _require_perm(actor, "cleanup_ops.change_pipelinepause")
    reason = _operator_reason(reason)
    with transaction.atomic():
        pause = (
            PipelinePause.objects.select_for_update().filter(resumed_at__isnull=True, portfolio_id=portfolio_id).first()
        )
        if pause is None:
            raise ValidationError({"portfolio": "not paused"})
        pause.mark_resumed(by=actor, at=timezone.now(), reason=reason)
        audit_event_record(
            actor=actor,
            action="pipeline.resumed",
            object_type="portfolio" if portfolio_id else "pipeline",
            object_id=portfolio_id or "all",
            reason=reason,
            details={"pause_id": pause.pk},
        )
        transaction.on_commit(_wake_dispatcher)
    return pause
