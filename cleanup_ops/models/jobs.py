"""Sweeps, jobs and the ledger: the durable state of the cleanup pipeline.

``CleanupJob`` is the source of truth. A django-q2 message carries only a job
id and is a hint to look at the row: the worker leases the job with a
conditional UPDATE and exits quietly when the job is not due, already leased,
or finished. ``LedgerEntry`` is the proof of disposition: one row per applied
batch, written in the same transaction as the DELETE, unique by operation id.

Jobs come in two kinds. A ``delete`` job is one partition of a sweep. A
``purge`` job removes the attachments of one applied batch from the document
store: the batch's transaction writes its ``PurgeRequest`` (the outbox row:
document ids and an idempotency key derived from the operation id) and the job
itself, so a batch that deleted nothing (held, replayed, rolled back) purges
nothing (the outbox's models are in ``models/outbox.py``). A redrive of a purge job inherits its kind and its request.

Every state predicate of a job ("due", "open", "live lease", …) is defined
once, on ``CleanupJobQuerySet``, and used everywhere (dispatch, leasing,
selectors, the chaos checks), so the rules cannot drift apart.
"""

from __future__ import annotations

import builtins
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, IntegerField, Q, Value

from cleanup_ops.lifecycle import LEASE_CLEARED, OPEN_STATES, JobEvent, JobOutcome, JobState, next_state
from cleanup_ops.models.interventions import DeadLetter, DeadLetterStatus, PipelinePause
from cleanup_ops.models.scope_keys import ScopeKey
from retention.registry import record_kind_choices


class SweepStatus(models.TextChoices):
    ADMITTING = "admitting", "Admitting"
    RUNNING = "running", "Running"
    DRAINED = "drained", "Drained"
    DRAINED_WITH_DEAD_LETTERS = "drained_with_dead_letters", "Drained with dead letters"


def superseded_q(prefix: str = "") -> Q:
    """Dead jobs whose dead letter was redriven: their work moved to the
    redrive job, so figures of what is dead (the sweep's status, "jobs
    dead", the completion rate) count the redrive instead. ``prefix``: the
    path to the job (``"jobs__"`` from a sweep). A join on a one-to-one, so a
    ``Count(filter=…)`` counts each job once."""
    return Q(**{f"{prefix}state": JobState.DEAD, f"{prefix}dead_letter__status": DeadLetterStatus.REDRIVEN})


class SweepQuerySet(models.QuerySet["Sweep"]):
    def reopen(self, *, sweep_ids: set[int]) -> None:
        """New work (a redrive, a re-queued purge) makes finished sweeps running
        again. Called in the transaction that creates the work: its row
        update is what ``sweeps.sweep_mark_drained_if_finished`` serialises against."""
        self.filter(pk__in=sweep_ids).exclude(status=SweepStatus.ADMITTING).update(
            status=SweepStatus.RUNNING, finished_at=None
        )


class Sweep(models.Model):
    """One scheduled run, keyed by its slot: ``cleanup:2026-08-21T02:00Z``."""

    Status = SweepStatus

    objects = SweepQuerySet.as_manager()

    key = models.CharField(max_length=40, unique=True)
    slot = models.DateTimeField()
    status = models.CharField(max_length=30, choices=SweepStatus.choices, default=SweepStatus.ADMITTING)
    jobs_admitted = models.PositiveIntegerField(default=0)
    carried_over = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-slot"]

    def __str__(self) -> str:
        return self.key

    def mark_admitted(self, *, jobs: int, carried_over: int, at: datetime) -> None:
        """Admission done: running, or drained at once when nothing was due."""
        self.jobs_admitted = jobs
        self.carried_over = carried_over
        self.status = SweepStatus.RUNNING if jobs else SweepStatus.DRAINED
        self.admitted_at = at
        self.finished_at = None if jobs else at
        self.save(update_fields=["jobs_admitted", "carried_over", "status", "admitted_at", "finished_at"])


# The scope a job, its dead letter, its redrive and its outbox rows share.
SCOPE_FIELDS = ("portfolio_id", "property_id", "record_kind", "policy_version_id")


def scope_of(job: Any) -> dict[str, Any]:
    """The scope fields of a job (a model instance or any object with those attributes)."""
    return {name: getattr(job, name) for name in SCOPE_FIELDS}


def open_q() -> Q:
    """Pending or leased: work that is not finished (dead jobs are not open)."""
    return Q(state__in=OPEN_STATES)


def live_lease_q(*, now: datetime) -> Q:
    """Leased, and the lease has not expired: a worker holds the job right now."""
    return Q(state=JobState.LEASED, lease_expires_at__gt=now)


def expired_lease_q(*, now: datetime) -> Q:
    return Q(state=JobState.LEASED, lease_expires_at__lte=now)


def due_q(*, now: datetime) -> Q:
    """Due now: pending and available, or leased with an expired lease (a dead
    worker's job is rescued by being due again)."""
    return Q(available_at__lte=now) & (Q(state=JobState.PENDING) | expired_lease_q(now=now))


def unpaused_q() -> Q:
    """Outside every active pause: neither the whole pipeline nor the job's
    portfolio is paused."""
    active = PipelinePause.objects.active()
    return ~Exists(active.filter(portfolio_id__isnull=True)) & ~Q(
        portfolio_id__in=active.filter(portfolio_id__isnull=False).values("portfolio_id")
    )


def due_work_q(*, now: datetime) -> Q:
    """Work a worker should be running for: due (``due_q``) or held by a live
    lease, outside every active pause. This is what a scaled-to-zero fleet
    scales on and what keeps its worker up: KEDA's query in
    ``docs/deploy/keda-scaledobject.yaml`` (a test runs it against this
    predicate), ``cleanup_health --due`` and ``cleanup_drain --until-idle``.
    A live lease counts because a worker holding one is busy: a large
    partition is leased nearly all the time it runs, and a fleet that saw no
    due job then would stop its only worker mid-drain."""
    return (due_q(now=now) | live_lease_q(now=now)) & unpaused_q()


def not_waiting_in_broker_q(*, now: datetime) -> Q:
    """No message for the job is waiting in the broker (or it was sent so long
    ago, more than a lease, that it must be lost)."""
    stale = now - timedelta(seconds=settings.CLEANUP_LEASE_SECONDS)
    return Q(enqueued_at__isnull=True) | Q(enqueued_at__lte=stale)


class CleanupJobQuerySet(models.QuerySet["CleanupJob"]):
    """The job's state predicates, each defined once (the ``*_q`` functions
    above, for use inside aggregates' ``filter=``)."""

    def open(self) -> CleanupJobQuerySet:
        return self.filter(open_q())

    def due(self, *, now: datetime) -> CleanupJobQuerySet:
        return self.filter(due_q(now=now))

    def due_work(self, *, now: datetime) -> CleanupJobQuerySet:
        return self.filter(due_work_q(now=now))

    def live_leases(self, *, now: datetime) -> CleanupJobQuerySet:
        return self.filter(live_lease_q(now=now))

    def expired_leases(self, *, now: datetime) -> CleanupJobQuerySet:
        return self.filter(expired_lease_q(now=now))

    def not_waiting_in_broker(self, *, now: datetime) -> CleanupJobQuerySet:
        return self.filter(not_waiting_in_broker_q(now=now))

    def deletes(self) -> CleanupJobQuerySet:
        return self.filter(job_kind=JobKind.DELETE)

    def lease_holders_by_portfolio(self, *, now: datetime) -> dict[int, int]:
        """Per portfolio, how many leases (workers) hold jobs right now: the
        portfolio's concurrency cap counts holders, not jobs, because one
        lease may hold several small partitions worked in one transaction."""
        return dict(self.live_leases(now=now).values_list("portfolio_id").annotate(n=_holders()).order_by())

    def lease_slots(self, *, now: datetime) -> tuple[set[int | None], dict[int, int]]:
        """(the portfolios under an active pause — None for a global one —,
        ``lease_holders_by_portfolio`` of these jobs) in one statement: what
        every lease and the dispatcher read before they take or send work."""
        paused = PipelinePause.objects.active().annotate(n=Value(PAUSED, output_field=IntegerField()))
        holders = self.live_leases(now=now).values_list("portfolio_id").annotate(n=_holders()).order_by()
        # No ORDER BY on either side (PipelinePause is ordered by default):
        # an arm's ORDER BY would need parentheses, and the union is a set.
        rows = list(holders.union(paused.values_list("portfolio_id", "n").order_by(), all=True))
        return {p for p, n in rows if n == PAUSED}, {p: n for p, n in rows if n != PAUSED and p is not None}


# ``lease_slots``' mark of a pause among the holder counts (a count is never negative).
PAUSED = -1


def _holders() -> models.Expression:
    # A leased row without a token (never written by a lease, but possible in
    # data) counts as a holder of its own.
    return models.Count("lease_token", distinct=True) + models.Count("id", filter=Q(lease_token__isnull=True))


class JobKind(models.TextChoices):
    DELETE = "delete", "Delete records"
    PURGE = "purge", "Purge attachments"


class CleanupJob(models.Model):
    """One partition of a sweep: (sweep, portfolio, property, record kind)."""

    State = JobState
    Outcome = JobOutcome
    Kind = JobKind

    objects = CleanupJobQuerySet.as_manager()
    # Not columns: set on the instances the console's selectors hand to its
    # templates (console_selectors.pauses.jobs_mark_paused, console_selectors.jobs.job_chain).
    # Declared for the type checker only.
    paused: bool
    dead_letter_or_none: DeadLetter | None

    sweep = models.ForeignKey(Sweep, on_delete=models.PROTECT, related_name="jobs")
    key = models.CharField(max_length=255, unique=True)
    job_kind = models.CharField(
        max_length=10, choices=JobKind.choices, default=JobKind.DELETE, db_default=JobKind.DELETE
    )
    # Purge jobs only: the outbox row with the document ids (shared by redrives).
    purge_request = models.ForeignKey(
        "PurgeRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    # Keys of the host's customer and site, of their own type, with no
    # database constraint: the scope may disappear while the job waits, and
    # the job must still be able to say so (outcome scope_missing).
    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL)
    property = ScopeKey(settings.RETENTION_PROPERTY_MODEL, null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40, choices=record_kind_choices)
    policy_version = models.ForeignKey("retention.PolicyVersion", on_delete=models.PROTECT, related_name="+")
    cutoff = models.DateTimeField(help_text="Cutoff of the version admitted with the job.")

    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING)
    outcome = models.CharField(max_length=20, choices=JobOutcome.choices, blank=True, default="")
    available_at = models.DateTimeField()
    enqueued_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    leases = models.PositiveIntegerField(default=0)
    first_leased_at = models.DateTimeField(null=True, blank=True)

    attempt = models.PositiveIntegerField(default=0, help_text="Failed attempts so far (retry budget).")
    last_error_category = models.CharField(max_length=30, blank=True, default="")
    last_error_class = models.CharField(max_length=100, blank=True, default="")
    redrive_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="redrives")

    cursor = models.BigIntegerField(default=0, help_text="Largest record id already passed.")
    # A non-integer key's cursor (a UUID as text; "" before the first batch):
    # ``retention.registry``, "Keys". Integer kinds leave it "".
    cursor_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    batch_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="Rows per batch of its last batch (its policy version's, when it ran)."
    )
    batches = models.PositiveIntegerField(default=0)
    rows_deleted = models.PositiveBigIntegerField(default=0)
    rows_held = models.PositiveBigIntegerField(default=0)

    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["available_at", "id"], condition=Q(state__in=["pending", "leased"]), name="job_open_due_idx"
            ),
            models.Index(fields=["sweep", "state"], name="job_sweep_state_idx"),
        ]
        constraints = [
            # At most one open delete job per partition, whoever creates it
            # (admission, a concurrent admission of another sweep, a redrive):
            # two would run the same rows at once, and the one whose DELETE
            # finds them gone would report them as held. Purge jobs are not
            # partitions (several may be open for one scope).
            models.UniqueConstraint(
                fields=["portfolio_id", "property_id", "record_kind"],
                condition=Q(state__in=["pending", "leased"], job_kind="delete"),
                name="job_one_open_per_partition",
            ),
            # A kind without a property is partitioned by its portfolio
            # (property_id NULL), which the index above does not constrain
            # (NULLs are distinct): the same rule, on (portfolio, kind).
            models.UniqueConstraint(
                fields=["portfolio_id", "record_kind"],
                condition=Q(state__in=["pending", "leased"], job_kind="delete", property_id__isnull=True),
                name="job_one_open_per_portfolio_partition",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @builtins.property  # `property` is a field name in this class body
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def has_live_lease(self, *, now: datetime) -> bool:
        """``live_lease_q`` for a row already in memory."""
        return self.state == JobState.LEASED and self.lease_expires_at is not None and self.lease_expires_at > now

    # Transitions after a failure; the caller holds the job row lock.
    _RETRY_FIELDS = ("state", "available_at", "attempt", "last_error_category", "last_error_class")
    _LEASE_FIELDS = tuple(LEASE_CLEARED)

    def _clear_lease(self) -> None:
        for field, value in LEASE_CLEARED.items():
            setattr(self, field, value)

    def mark_retry(self, *, at: datetime) -> None:
        self.state = next_state(JobEvent.RETRY, self.state)
        self.available_at = at
        self._clear_lease()
        self.save(update_fields=[*self._RETRY_FIELDS, *self._LEASE_FIELDS])

    def mark_dead(self) -> None:
        # From leased (out of retries) or pending (an operator's cancel).
        self.state = next_state(JobEvent.FAIL if self.state == JobState.LEASED else JobEvent.CANCEL, self.state)
        self._clear_lease()
        self.save(update_fields=["state", "attempt", "last_error_category", "last_error_class", *self._LEASE_FIELDS])


class LedgerEntry(models.Model):
    """One applied batch. Identifiers, ranges and counts only: no record contents."""

    operation_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(CleanupJob, on_delete=models.PROTECT, related_name="ledger_entries")
    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL)
    property = ScopeKey(settings.RETENTION_PROPERTY_MODEL, null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    policy_version_id = models.BigIntegerField()
    cutoff = models.DateTimeField()
    after_id = models.BigIntegerField()
    last_id = models.BigIntegerField()
    # A non-integer key's range, as text (``retention.registry``, "Keys");
    # the two bigints are then 0. Integer kinds leave these "".
    after_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    last_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    batch_limit = models.PositiveIntegerField()
    candidates = models.PositiveIntegerField()
    rows_deleted = models.PositiveIntegerField()
    # Candidates an active hold covered, counted from the hold itself. The
    # rest of candidates minus deleted is rows the application changed, moved or
    # deleted while the batch ran: kept by nobody, so not "held".
    rows_held = models.PositiveIntegerField(default=0)
    applied_at = models.DateTimeField()
    # The hash chain (``cleanup_ops.ledger_chain``): written by the database
    # as the row is inserted, never by Python. NULL only on a row written
    # before the chain existed and not yet backfilled.
    prev_id = models.BigIntegerField(null=True, blank=True, help_text="The previous row of this portfolio's chain.")
    # NULL, not "": "not linked yet" differs from a first row's empty previous hash.
    prev_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    entry_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"
        indexes = [
            # Throughput per hour and retention-debt figures read recent rows only.
            models.Index(fields=["applied_at"], include=["rows_deleted", "record_kind"], name="ledger_applied_idx"),
        ]

    def __str__(self) -> str:
        return self.operation_id
