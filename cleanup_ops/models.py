"""Sweeps, jobs and the ledger: the durable state of the cleanup pipeline.

``CleanupJob`` is the source of truth. A django-q2 message carries only a job
id and is a hint to look at the row: the worker leases the job with a
conditional UPDATE and exits quietly when the job is not due, already leased,
or finished. ``LedgerEntry`` is the proof of disposition: one row per applied
batch, written in the same transaction as the DELETE, unique by operation id.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from retention.registry import RECORD_KIND_CHOICES


class SweepStatus(models.TextChoices):
    ADMITTING = "admitting", "Admitting"
    RUNNING = "running", "Running"
    DRAINED = "drained", "Drained"
    DRAINED_WITH_DEAD_LETTERS = "drained_with_dead_letters", "Drained with dead letters"


class Sweep(models.Model):
    """One scheduled run, keyed by its slot: ``cleanup:2026-08-21T02:00Z``."""

    Status = SweepStatus

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


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"  # waiting for available_at, or due
    LEASED = "leased", "Leased"  # a worker holds it until lease_expires_at
    DONE = "done", "Done"  # finished with an outcome
    DEAD = "dead", "Dead"  # stopped; an operator decides (dead letters)


OPEN_STATES = (JobState.PENDING, JobState.LEASED)


class JobOutcome(models.TextChoices):
    DELETED = "deleted", "Deleted"
    NOTHING_ELIGIBLE = "nothing_eligible", "Nothing eligible"
    HELD = "held", "Held"
    SCOPE_MISSING = "scope_missing", "Scope missing"
    POLICY_WITHDRAWN = "policy_withdrawn", "Policy withdrawn"


class CleanupJob(models.Model):
    """One partition of a sweep: (sweep, portfolio, property, record kind)."""

    State = JobState
    Outcome = JobOutcome

    sweep = models.ForeignKey(Sweep, on_delete=models.PROTECT, related_name="jobs")
    key = models.CharField(max_length=255, unique=True)
    # Plain ids, not foreign keys: the scope may disappear while the job waits,
    # and the job must still be able to say so (outcome scope_missing).
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField()
    record_kind = models.CharField(max_length=40, choices=RECORD_KIND_CHOICES)
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

    cursor = models.BigIntegerField(default=0, help_text="Largest record id already passed.")
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
            models.Index(
                fields=["portfolio_id", "property_id", "record_kind"],
                condition=Q(state__in=["pending", "leased"]),
                name="job_open_partition_idx",
            ),
            models.Index(fields=["sweep", "state"], name="job_sweep_state_idx"),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


class LedgerEntry(models.Model):
    """One applied batch. Identifiers, ranges and counts only: no record contents."""

    operation_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(CleanupJob, on_delete=models.PROTECT, related_name="ledger_entries")
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField()
    record_kind = models.CharField(max_length=40)
    policy_version_id = models.BigIntegerField()
    cutoff = models.DateTimeField()
    after_id = models.BigIntegerField()
    last_id = models.BigIntegerField()
    batch_limit = models.PositiveIntegerField()
    candidates = models.PositiveIntegerField()
    rows_deleted = models.PositiveIntegerField()
    applied_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return self.operation_id
