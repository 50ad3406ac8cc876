"""Operators' decisions: redrive or dismiss dead letters, pause and resume.

Every decision needs a written reason (``MIN_REASON_LENGTH``), the actor's
permission (``actor=None`` is a trusted command-line operator), and leaves one
audit event per object it changed, in the same transaction.

Redrive and dismiss share one helper for the single and the bulk form:
letters are locked ``FOR UPDATE`` and must still be open (a single letter that
is not open is a ``DeadLetterNotOpen``; in bulk such letters are skipped). A
redrive is a *new* job with a new id and the key ``<root key>:redrive:<n>``
(the root is the job that was first admitted, so a redrive of a redrive keeps
a bounded key and ``n`` counts the redrives of that root), copying the old
job's scope and cursor (the ledger replays anything already applied, so the
old cursor is a safe start); a purge job's redrive inherits its kind and its
outbox row. A delete job's redrive whose partition already has an open job
(a later sweep admitted it) creates nothing and says which job that is
(``PartitionBusy``): the database holds one open job per partition. In bulk
each letter is decided in its own savepoint: one that cannot be redriven (a
database error, a busy partition) stays open and is reported in the result,
without rolling back the others. Redriven sweeps are running again,
and the dispatcher is woken after commit.

A pause stops new leases (everywhere, or in one portfolio); slices in flight
finish their batch.

Jobs themselves can be acted on too, one or every job matching a filter
(``jobs_act``), each with a reason and one audit event per job:

- **run now**: a pending job (backing off after a failure, or deferred by the
  rate limiter) becomes due at once — ``available_at`` is now and any hint
  already sent for later is forgotten (``enqueued_at``), so the dispatcher
  sends it at its next call. It then passes the same gates as any due job:
  pauses, the portfolio's lease cap, the rate limiter. No attempt is spent.
- **cancel**: a pending job stops and becomes a dead letter of category
  ``cancelled``, which can be redriven like any other (its cursor is kept). A
  leased job is not cancelled (a worker holds it; pause its portfolio to stop
  it after its slice). The sweep finishes in the same transaction if that was
  its last open job.

Who may act where is the one rule of ``retention.scoping``: an action on
jobs is limited to the portfolios where the actor holds its permission. Run
now is a decision to try work again, like a redrive (the
``redrive_deadletter`` permission); cancelling closes work without doing it,
like a dismissal (``dismiss_deadletter``): no new role is needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, IntegrityError, models, transaction

from cleanup_ops import clock
from cleanup_ops.checkpoints import checkpoint
from cleanup_ops.console_selectors.jobs import JobFilter
from cleanup_ops.dispatch import dispatch_after_commit
from cleanup_ops.execution.leases import pause_locks
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, JobState, PipelinePause, Sweep, scope_of
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.selectors import DeadLetterFilter
from cleanup_ops.sweeps import sweep_mark_drained_if_finished
from retention.actors import Actor
from retention.domain import portfolio_model
from retention.inputs import MIN_REASON_LENGTH as MIN_REASON_LENGTH  # re-exported: the views read it here
from retention.models import AuditEvent
from retention.scoping import portfolio_ids_q, portfolio_ids_where
from retention.services import audit_event_record, require_reason


class Decision(models.TextChoices):
    REDRIVE = "redrive", "Redrive"
    DISMISS = "dismiss", "Dismiss"


_PERMISSION = {Decision.REDRIVE: "cleanup_ops.redrive_deadletter", Decision.DISMISS: "cleanup_ops.dismiss_deadletter"}


class DeadLetterNotOpen(Exception):
    """Redrive or dismiss of a letter that an operator already resolved."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(f"dead letter {letter.pk} is {letter.status}, not open")
        self.letter = letter


def operator_reason(reason: str | None) -> str:
    return require_reason(reason or "", field="reason")


def _require_perm(actor: Actor | None, perm: str) -> None:
    # actor None: a trusted command-line operator (see cleanup_redrive).
    if actor is not None and not actor.has_perm(perm):
        raise PermissionDenied(f"You do not have the {perm} permission.")


_REDRIVE_SUFFIX = re.compile(r"(?::redrive:[0-9]+)+\Z")


def redrive_key(job: CleanupJob) -> str:
    """``<root key>:redrive:<n>``: the root is the first job of the chain (any
    ``:redrive:<n>`` suffixes stripped), ``n`` one more than the highest
    redrive of that root so far, so the key stays bounded however often a
    job is redriven."""
    root = _REDRIVE_SUFFIX.sub("", job.key)
    prefix = f"{root}:redrive:"
    numbers = [
        int(key[len(prefix) :])
        for key in CleanupJob.objects.filter(key__startswith=prefix).values_list("key", flat=True)
        if key[len(prefix) :].isascii() and key[len(prefix) :].isdigit()
    ]
    return f"{prefix}{max(numbers, default=0) + 1}"


class PartitionBusy(Exception):
    """Redrive of a delete job's letter while its partition has an open job
    (a later sweep admitted it again): nothing is created — the database
    allows one open job per partition — and the letter stays open. That job
    covers the partition from the start with a later cutoff, so the letter
    can be dismissed, or redriven once that job has finished."""

    def __init__(self, letter: DeadLetter, open_job_id: int | None) -> None:
        super().__init__(
            f"dead letter {letter.pk}: its partition already has open job {open_job_id}; nothing was created"
            " (dismiss the letter, or redrive it once that job has finished)"
        )
        self.letter = letter
        self.open_job_id = open_job_id


@dataclass(frozen=True)
class LetterFailure:
    """A letter a bulk redrive could not redrive: it stays open."""

    letter_id: int
    error_class: str
    open_job_id: int | None = None  # PartitionBusy: the partition's open job

    def describe(self) -> str:
        if self.open_job_id is not None:
            return f"{self.letter_id} (its partition already has open job {self.open_job_id})"
        return f"{self.letter_id} ({self.error_class})"


@dataclass
class BulkRedrive:
    """What a bulk redrive did: the new jobs, and the letters it could not redrive.

    Iterating (and ``len``) goes over the new jobs."""

    jobs: list[CleanupJob] = field(default_factory=list)
    failed: list[LetterFailure] = field(default_factory=list)

    def __iter__(self) -> Iterator[CleanupJob]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


def _open_job_of_partition(job: CleanupJob) -> int | None:
    # The keys of any type (property None: a kind without a property).
    partition: dict[str, Any] = {
        "portfolio_id": job.portfolio_id,
        "property_id": job.property_id,
        "record_kind": job.record_kind,
    }
    return CleanupJob.objects.open().deletes().filter(**partition).values_list("id", flat=True).first()


def _redrive_job(letter: DeadLetter, *, now: datetime) -> CleanupJob:
    """The new job, or ``PartitionBusy`` when the partition already has an
    open delete job. The partial unique index ``job_one_open_per_partition``
    is the guarantee; the read first only names the job that holds it, and an
    insert that loses a race with a concurrent admission is caught the same way."""
    old = letter.job
    if old.job_kind == JobKind.DELETE:
        busy = _open_job_of_partition(old)
        if busy is not None:
            raise PartitionBusy(letter, busy)
    try:
        with transaction.atomic():
            return CleanupJob.objects.create(
                sweep_id=old.sweep_id,
                key=redrive_key(old),
                # A purge job's kind and outbox row belong to its scope too.
                job_kind=old.job_kind,
                purge_request_id=old.purge_request_id,
                cutoff=old.cutoff,
                # The old cursor is a safe start: the ledger replays anything already applied.
                cursor=old.cursor,
                available_at=now,
                redrive_of=old,
                **scope_of(old),
            )
    except IntegrityError:
        busy = _open_job_of_partition(old) if old.job_kind == JobKind.DELETE else None
        if busy is None:
            raise
        raise PartitionBusy(letter, busy) from None


def spanning_reason(*, portfolios: int, event_id: int) -> str:
    """What a portfolio's own copy of a decision says when the decision
    covered several portfolios: the operator's words may name the others
    ("Birch's store was down too"), so they stay in the platform's audit
    event ``event_id``, which no customer reads."""
    return (
        f"One operator decision covering {portfolios} portfolios; its reason is kept in the platform's"
        f" audit trail (event {event_id})."
    )


def _spanning_event(
    *, actor: Actor | None, action: str, reason: str, portfolio_ids: set[int], count: int, noun: str
) -> AuditEvent | None:
    """The one platform event of a decision over several portfolios (no
    ``portfolio_id`` in its details, so it is scoped to platform roles), or
    ``None`` for a decision within one portfolio, whose reason is its own."""
    if len(portfolio_ids) <= 1:
        return None
    return audit_event_record(
        actor=actor,
        action=action,
        object_type="pipeline",
        object_id="all",
        reason=reason,
        details={noun: count, "portfolios": len(portfolio_ids)},
    )


def _decide_one(
    letter: DeadLetter,
    *,
    decision: Decision,
    actor: Actor | None,
    reason: str,
    now: datetime,
    shown_reason: str | None = None,
) -> CleanupJob | None:
    """Apply one decision to one locked, open letter; the redrive job, if any.
    ``shown_reason``: what the letter itself keeps, when that is not ``reason``
    (a decision over several portfolios, ``spanning_reason``); the letter's
    own audit event is platform-scoped and keeps ``reason``."""
    job = None
    kept = reason if shown_reason is None else shown_reason
    if decision == Decision.REDRIVE:
        job = _redrive_job(letter, now=now)
        letter.mark_resolved(status=DeadLetter.Status.REDRIVEN, by=actor, at=now, reason=kept, redrive_job=job)
        details = {"old_job_id": letter.job_id, "new_job_id": job.pk}
    else:
        letter.mark_resolved(status=DeadLetter.Status.DISMISSED, by=actor, at=now, reason=kept)
        details = {"job_id": letter.job_id}
    audit_event_record(
        actor=actor,
        action=f"dead_letter.{'redriven' if decision == Decision.REDRIVE else 'dismissed'}",
        object_type="dead_letter",
        object_id=letter.pk,
        reason=reason,
        details={**details, "category": letter.category, "sweep_id": letter.sweep_id},
    )
    return job


def _decide(
    letters: list[DeadLetter],
    *,
    decision: Decision,
    actor: Actor | None,
    reason: str,
    now: datetime,
    isolate: bool = False,
) -> tuple[list[DeadLetter], list[CleanupJob], list[LetterFailure]]:
    """Apply one decision to locked, open letters: (letters decided, redrive
    jobs created, letters that failed). With ``isolate`` each letter has its
    own savepoint and a database error leaves just that letter open."""
    decided, jobs, failed = [], [], []
    spanning = _spanning_event(
        actor=actor,
        action=f"dead_letters.{'redriven' if decision == Decision.REDRIVE else 'dismissed'}",
        reason=reason,
        portfolio_ids={letter.portfolio_id for letter in letters},
        count=len(letters),
        noun="letters",
    )
    shown = None
    if spanning is not None:
        shown = spanning_reason(portfolios=spanning.details["portfolios"], event_id=spanning.pk)
    for letter in letters:
        if isolate:
            try:
                with transaction.atomic():
                    job = _decide_one(
                        letter, decision=decision, actor=actor, reason=reason, now=now, shown_reason=shown
                    )
            except PartitionBusy as exc:
                failed.append(LetterFailure(letter.pk, type(exc).__name__, open_job_id=exc.open_job_id))
                continue
            except DatabaseError as exc:
                failed.append(LetterFailure(letter.pk, type(exc).__name__))
                continue
        else:
            job = _decide_one(letter, decision=decision, actor=actor, reason=reason, now=now, shown_reason=shown)
        decided.append(letter)
        if job is not None:
            jobs.append(job)
    if jobs:
        Sweep.objects.reopen(sweep_ids={job.sweep_id for job in jobs})
        dispatch_after_commit()
    return decided, jobs, failed


def dead_letters_decide(
    *,
    decision: Decision,
    actor: Actor | None,
    reason: str,
    letter_filter: DeadLetterFilter | None = None,
    letter_id: int | None = None,
) -> tuple[list[DeadLetter], list[CleanupJob], list[LetterFailure]]:
    """Redrive or dismiss one letter (``letter_id``: must be open; a failure
    raises) or every open letter matching ``letter_filter``, in one
    transaction with a savepoint per letter. Returns the letters decided, the
    redrive jobs created and the letters that could not be decided."""
    _require_perm(actor, _PERMISSION[decision])
    reason = operator_reason(reason)
    now = clock.now()
    locked = DeadLetter.objects.select_for_update().select_related("job")
    with transaction.atomic():
        if letter_id is not None:
            letter = locked.get(pk=letter_id)
            if letter.status != DeadLetter.Status.OPEN:
                raise DeadLetterNotOpen(letter)
            letters = [letter]
        else:
            chosen = letter_filter or DeadLetterFilter()
            letters = list(locked.open().filter(chosen.q(now=now)).order_by("id"))
        checkpoint("redrive.after_lock")
        return _decide(letters, decision=decision, actor=actor, reason=reason, now=now, isolate=letter_id is None)


def dead_letter_redrive(*, letter_id: int, actor: Actor | None, reason: str) -> CleanupJob:
    """Try a dead letter again as a *new* job (new id, key ``<root key>:redrive:<n>``)."""
    _, jobs, _ = dead_letters_decide(decision=Decision.REDRIVE, actor=actor, reason=reason, letter_id=letter_id)
    return jobs[0]


def dead_letter_dismiss(*, letter_id: int, actor: Actor | None, reason: str) -> DeadLetter:
    letters, _, _ = dead_letters_decide(decision=Decision.DISMISS, actor=actor, reason=reason, letter_id=letter_id)
    return letters[0]


def dead_letters_redrive_bulk(
    *, actor: Actor | None, reason: str, letter_filter: DeadLetterFilter | None = None
) -> BulkRedrive:
    """Redrive every open letter matching the filter, one audit event each.
    Letters no longer open are skipped (the caller sees which from the jobs);
    letters that could not be redriven stay open and are listed in ``failed``."""
    _, jobs, failed = dead_letters_decide(
        decision=Decision.REDRIVE, actor=actor, reason=reason, letter_filter=letter_filter
    )
    return BulkRedrive(jobs=jobs, failed=failed)


def dead_letters_dismiss_bulk(
    *, actor: Actor | None, reason: str, letter_filter: DeadLetterFilter | None = None
) -> int:
    letters, _, _ = dead_letters_decide(
        decision=Decision.DISMISS, actor=actor, reason=reason, letter_filter=letter_filter
    )
    return len(letters)


def _pause_scope(portfolio_id: int | None) -> tuple[str, object]:
    return ("portfolio", portfolio_id) if portfolio_id else ("pipeline", "all")


def pipeline_pause(*, actor: Actor | None, reason: str, portfolio_id: Any = None) -> PipelinePause:
    """Stop new leases (everywhere, or for one portfolio); in-flight slices finish."""
    _require_perm(actor, "cleanup_ops.add_pipelinepause")
    reason = operator_reason(reason)
    if portfolio_id is not None and not portfolio_model()._default_manager.filter(pk=portfolio_id).exists():
        raise ValidationError({"portfolio": f"no portfolio with id {portfolio_id}"})
    object_type, object_id = _pause_scope(portfolio_id)
    try:
        with transaction.atomic():
            # The stripe locks a lease reads the pauses under (lock, then read):
            # no lease commits after this pause without having seen it.
            pause_locks(portfolio_id)
            checkpoint("pause.after_lock")
            # The partial unique constraint pause_one_active_per_scope (NULLS
            # NOT DISTINCT) refuses a second active pause of a scope.
            pause = PipelinePause.objects.create(
                portfolio_id=portfolio_id, reason=reason, paused_by=actor, paused_at=clock.now()
            )
            audit_event_record(
                actor=actor,
                action="pipeline.paused",
                object_type=object_type,
                object_id=object_id,
                reason=reason,
                details={"pause_id": pause.pk},
            )
    except IntegrityError:
        raise ValidationError({"portfolio": "already paused"}) from None
    return pause


def pipeline_resume(*, actor: Actor | None, reason: str, portfolio_id: Any = None) -> PipelinePause:
    _require_perm(actor, "cleanup_ops.change_pipelinepause")
    reason = operator_reason(reason)
    object_type, object_id = _pause_scope(portfolio_id)
    with transaction.atomic():
        pause = PipelinePause.objects.select_for_update().active().filter(portfolio_id=portfolio_id).first()
        if pause is None:
            raise ValidationError({"portfolio": "not paused"})
        pause.mark_resumed(by=actor, at=clock.now(), reason=reason)
        audit_event_record(
            actor=actor,
            action="pipeline.resumed",
            object_type=object_type,
            object_id=object_id,
            reason=reason,
            details={"pause_id": pause.pk},
        )
        dispatch_after_commit()
    return pause


# --- Actions on jobs ---------------------------------------------------------------


class JobAction(models.TextChoices):
    RUN_NOW = "run_now", "Run now"
    CANCEL = "cancel", "Cancel"


JOB_ACTION_PERMISSION = {
    JobAction.RUN_NOW: "cleanup_ops.redrive_deadletter",
    JobAction.CANCEL: "cleanup_ops.dismiss_deadletter",
}


@dataclass
class JobsActed:
    """What an action on jobs did: the jobs it changed (and, for a cancel,
    their dead letters), and how many matched but were no longer pending."""

    jobs: list[int] = field(default_factory=list)
    letters: list[int] = field(default_factory=list)
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.jobs)


def jobs_in_reach(*, action: JobAction, actor: Actor | None, job_filter: JobFilter) -> models.QuerySet[CleanupJob]:
    """The jobs ``action`` applies to among those ``job_filter`` matches,
    within the portfolios where ``actor`` holds the action's permission."""
    scope = None if actor is None else portfolio_ids_where(actor, JOB_ACTION_PERMISSION[action])
    return CleanupJob.objects.filter(job_filter.q(), portfolio_ids_q(scope), state=JobState.PENDING)


def jobs_act(*, action: JobAction, actor: Actor | None, reason: str, job_filter: JobFilter) -> JobsActed:
    """Run now or cancel every pending job ``job_filter`` matches in the
    actor's reach (see the module docstring), in one transaction, the job
    rows locked ``FOR UPDATE``; one audit event per job."""
    _require_perm(actor, JOB_ACTION_PERMISSION[action])
    reason = operator_reason(reason)
    now = clock.now()
    result = JobsActed()
    with transaction.atomic():
        matched = CleanupJob.objects.filter(job_filter.q())
        if actor is not None:
            matched = matched.filter(portfolio_ids_q(portfolio_ids_where(actor, JOB_ACTION_PERMISSION[action])))
        # Locked in id order (two bulk actions never deadlock); the state is
        # re-read under the lock: a worker may have leased a job meanwhile.
        jobs = list(matched.select_for_update().order_by("id"))
        sweeps: set[int] = set()
        pending = [job for job in jobs if job.state == JobState.PENDING]
        verb = "job.run_now" if action == JobAction.RUN_NOW else "job.cancelled"
        # Each job's event is in its portfolio's audit trail: a reason written
        # for several portfolios is kept once, for the platform (item 5).
        spanning = _spanning_event(
            actor=actor,
            action=f"jobs.{'run_now' if action == JobAction.RUN_NOW else 'cancelled'}",
            reason=reason,
            portfolio_ids={job.portfolio_id for job in pending},
            count=len(pending),
            noun="jobs",
        )
        per_job_reason = reason
        if spanning is not None:
            per_job_reason = spanning_reason(portfolios=spanning.details["portfolios"], event_id=spanning.pk)
        for job in jobs:
            if job.state != JobState.PENDING:
                result.skipped += 1
                continue
            details: dict[str, object] = {"sweep_id": job.sweep_id, "portfolio_id": job.portfolio_id}
            if spanning is not None:
                details["decision_event_id"] = spanning.pk
            if action == JobAction.RUN_NOW:
                job.available_at = now
                job.enqueued_at = None  # a hint sent for later must not hold it back
                job.save(update_fields=["available_at", "enqueued_at"])
            else:
                letter = _job_cancel(job, now=now)
                result.letters.append(letter.pk)
                details |= {"letter_id": letter.pk, "category": FailureCategory.CANCELLED}
                sweeps.add(job.sweep_id)
            audit_event_record(
                actor=actor, action=verb, object_type="job", object_id=job.pk, reason=per_job_reason, details=details
            )
            result.jobs.append(job.pk)
        for sweep_id in sorted(sweeps):
            sweep_mark_drained_if_finished(sweep_id=sweep_id, now=now)
        if action == JobAction.RUN_NOW and result.jobs:
            dispatch_after_commit()
    return result


def _job_cancel(job: CleanupJob, *, now: datetime) -> DeadLetter:
    """The job stops (dead) with a ``cancelled`` letter; the caller holds its row lock."""
    job.last_error_category = FailureCategory.CANCELLED
    job.last_error_class = ""
    job.mark_dead()
    return DeadLetter.objects.create(
        job=job,
        category=FailureCategory.CANCELLED,
        attempts=job.attempt,
        first_seen_at=job.first_leased_at or job.created_at or now,
        last_seen_at=now,
        sweep_id=job.sweep_id,
        **scope_of(job),
    )
