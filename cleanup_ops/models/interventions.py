"""What operators decide about: dead letters (stopped jobs waiting in the
inbox) and pauses of the pipeline or of one portfolio.

Apart from the jobs (``models/jobs.py``), which read both: a job's state
predicates skip paused portfolios (``unpaused_q``) and count a redriven dead
letter's job as replaced (``superseded_q``). The foreign keys to jobs and
sweeps name the models as text, so this module imports none of them.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.db.models import Q

from cleanup_ops.models.scope_keys import ScopeKey

if TYPE_CHECKING:
    from cleanup_ops.models.jobs import CleanupJob
    from retention.actors import Actor


class DeadLetterStatus(models.TextChoices):
    OPEN = "open", "Open"
    REDRIVEN = "redriven", "Redriven"
    DISMISSED = "dismissed", "Dismissed"


def open_letter_q() -> Q:
    """A dead letter waiting for an operator's decision."""
    return Q(status=DeadLetterStatus.OPEN)


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    def open(self) -> DeadLetterQuerySet:
        return self.filter(open_letter_q())


class DeadLetter(models.Model):
    """A job that stopped: an operator inbox entry, never retried automatically."""

    Status = DeadLetterStatus

    objects = DeadLetterQuerySet.as_manager()

    job = models.OneToOneField("CleanupJob", on_delete=models.PROTECT, related_name="dead_letter")
    category = models.CharField(max_length=30)
    error_class = models.CharField(max_length=100, blank=True, default="")
    # The store's last answer, when the failure was one: its HTTP status and
    # message class (the declared media type, ``classification.message_class_of``).
    # Never a body.
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    message_class = models.CharField(max_length=100, blank=True, default="")
    attempts = models.PositiveIntegerField()
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL)
    property = ScopeKey(settings.RETENTION_PROPERTY_MODEL, null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    policy_version_id = models.BigIntegerField()
    sweep = models.ForeignKey("Sweep", on_delete=models.PROTECT, related_name="dead_letters")
    status = models.CharField(max_length=10, choices=DeadLetterStatus.choices, default=DeadLetterStatus.OPEN)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_reason = models.TextField(blank=True, default="")
    redrive_job = models.OneToOneField(
        "CleanupJob", null=True, blank=True, on_delete=models.PROTECT, related_name="redriven_from_letter"
    )

    class Meta:
        ordering = ["-last_seen_at", "-id"]
        permissions = [
            ("redrive_deadletter", "Can redrive dead letters"),
            ("dismiss_deadletter", "Can dismiss dead letters"),
        ]
        indexes = [
            models.Index(fields=["status", "category"], name="deadletter_status_idx"),
        ]

    def __str__(self) -> str:
        return f"Dead letter {self.pk} ({self.category})"

    # Categories whose ``attempts`` already counts the attempt that stopped the
    # job: a retry budget ran out (the last failure was counted), or an
    # operator cancelled it (no failure at all).
    _ATTEMPTS_COUNTED = frozenset({"retry_budget_exhausted", "age_budget_exhausted", "cancelled"})

    @builtins.property  # `property` is a field name in this class body
    def failed_attempts(self) -> int:
        """Failed attempts including the one that stopped the job. ``attempts``
        is the job's retry budget spent, which a failure that is not retried
        (a 4xx, an invalid input) never touches: such a letter failed once
        with ``attempts`` 0, and reads "1", not "0"."""
        return self.attempts if self.category in self._ATTEMPTS_COUNTED else self.attempts + 1

    def mark_resolved(
        self, *, status: str, by: Actor | None, at: datetime, reason: str, redrive_job: CleanupJob | None = None
    ) -> None:
        self.status = status
        self.resolved_by = by
        self.resolved_at = at
        self.resolution_reason = reason
        self.redrive_job = redrive_job
        self.save(update_fields=["status", "resolved_by", "resolved_at", "resolution_reason", "redrive_job"])


class PipelinePauseQuerySet(models.QuerySet["PipelinePause"]):
    def active(self) -> PipelinePauseQuerySet:
        return self.filter(resumed_at__isnull=True)

    def covering(self, *, portfolio_id: int) -> PipelinePauseQuerySet:
        """Active pauses that stop new leases in ``portfolio_id``: its own or a global one."""
        return self.active().filter(Q(portfolio_id__isnull=True) | Q(portfolio_id=portfolio_id))


class PipelinePause(models.Model):
    """An operator's pause: global (no portfolio) or for one portfolio.

    Active while ``resumed_at`` is null; at most one active pause per scope.
    """

    objects = PipelinePauseQuerySet.as_manager()

    portfolio = ScopeKey(settings.RETENTION_PORTFOLIO_MODEL, null=True, blank=True)
    reason = models.TextField()
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    paused_at = models.DateTimeField()
    resumed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resumed_at = models.DateTimeField(null=True, blank=True)
    resume_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-paused_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["portfolio_id"],
                condition=Q(resumed_at__isnull=True),
                nulls_distinct=False,
                name="pause_one_active_per_scope",
            ),
        ]

    def __str__(self) -> str:
        scope = f"portfolio {self.portfolio_id}" if self.portfolio_id else "pipeline"
        return f"Pause of {scope}"

    def mark_resumed(self, *, by: Actor | None, at: datetime, reason: str) -> None:
        self.resumed_by = by
        self.resumed_at = at
        self.resume_reason = reason
        self.save(update_fields=["resumed_by", "resumed_at", "resume_reason"])
