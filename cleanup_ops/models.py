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
nothing. A redrive of a purge job inherits its kind and its request.

Every state predicate of a job ("due", "open", "live lease", …) is defined
once, on ``CleanupJobQuerySet``, and used everywhere (dispatch, leasing,
selectors, the chaos checks), so the rules cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, Q

from cleanup_ops.lifecycle import JobEvent, JobOutcome, JobState, next_state
from retention.registry import record_kind_choices

if TYPE_CHECKING:
    from retention.actors import Actor


class SweepStatus(models.TextChoices):
    ADMITTING = "admitting", "Admitting"
    RUNNING = "running", "Running"
    DRAINED = "drained", "Drained"
    DRAINED_WITH_DEAD_LETTERS = "drained_with_dead_letters", "Drained with dead letters"


def sweep_status_seen(status: str, *, open_jobs: int, dead_jobs: int) -> str:
    """A sweep's status as a customer's staff see it: from their own jobs'
    counts (open, dead), so another customer's jobs never show through.
    ``dead_jobs``: dead jobs that were not redriven (``superseded_q``)."""
    if status == SweepStatus.ADMITTING:
        return status
    if open_jobs:
        return SweepStatus.RUNNING
    return SweepStatus.DRAINED_WITH_DEAD_LETTERS if dead_jobs else SweepStatus.DRAINED


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


OPEN_STATES = (JobState.PENDING, JobState.LEASED)

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
        return dict(
            self.live_leases(now=now)
            .values_list("portfolio_id")
            # A leased row without a token (never written by a lease, but
            # possible in data) counts as a holder of its own.
            .annotate(
                n=models.Count("lease_token", distinct=True) + models.Count("id", filter=Q(lease_token__isnull=True))
            )
            .order_by()
        )


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
    # Plain ids, not foreign keys: the scope may disappear while the job waits,
    # and the job must still be able to say so (outcome scope_missing).
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField(null=True, blank=True)  # NULL: a kind without a property
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

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def has_live_lease(self, *, now: datetime) -> bool:
        """``live_lease_q`` for a row already in memory."""
        return self.state == JobState.LEASED and self.lease_expires_at is not None and self.lease_expires_at > now

    # Transitions after a failure; the caller holds the job row lock.
    _RETRY_FIELDS = ("state", "available_at", "attempt", "last_error_category", "last_error_class")
    _LEASE_FIELDS = ("lease_token", "lease_owner", "lease_expires_at", "enqueued_at")

    def _clear_lease(self) -> None:
        self.lease_token = None
        self.lease_owner = ""
        self.lease_expires_at = None
        self.enqueued_at = None

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
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField(null=True, blank=True)  # NULL: a kind without a property
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

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"
        indexes = [
            # Throughput per hour and retention-debt figures read recent rows only.
            models.Index(fields=["applied_at"], include=["rows_deleted", "record_kind"], name="ledger_applied_idx"),
        ]

    def __str__(self) -> str:
        return self.operation_id


# S3's limit on an object key (bytes of UTF-8) and a storage alias's length:
# a purge's document reference is an HTTP document id, or ``<alias>:<key>``
# (``downstream.stores.document_ref``), kept exactly.
STORAGE_KEY_MAX_BYTES = 1024
STORE_ALIAS_MAX_LENGTH = 64
DOCUMENT_REF_MAX_LENGTH = STORE_ALIAS_MAX_LENGTH + 1 + STORAGE_KEY_MAX_BYTES


class PurgeRequest(models.Model):
    """Outbox row: the attachments of one applied batch, to be removed from the store.

    Written in the batch's transaction. ``key`` is the batch's operation id;
    each document's ``Idempotency-Key`` is ``<key>:<document id>``, so every
    retry, redelivery or redrive sends the same key for the same document.
    ``store`` is where the files are: ``""`` for the HTTP document store, or
    the ``STORAGES`` alias of the kind at the batch's time; ``document_ids``
    are the documents' references (``downstream.stores.document_ref``).
    Ids or keys that cannot be purged (an HTTP id that is not a plain
    identifier — it could be a URL or a path smuggled into a record —, a key
    too long for the storage, blank, or refused by it) are never stored and
    never sent: their count is ``invalid_ids`` and their records are named in
    ``unpurgeable`` (``{"record_id": …, "problem": …}``, the problem a short
    category, never the key), and the purge job then ends as a
    ``policy_or_input`` dead letter naming the kind and those records.
    """

    key = models.CharField(max_length=64, unique=True)
    delete_job = models.ForeignKey(CleanupJob, on_delete=models.PROTECT, related_name="purge_requests")
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField(null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    store = models.CharField(max_length=STORE_ALIAS_MAX_LENGTH, blank=True, default="")
    document_ids = models.JSONField(default=list)
    invalid_ids = models.PositiveIntegerField(default=0)
    unpurgeable = models.JSONField(default=list, blank=True)
    documents_purged = models.PositiveIntegerField(default=0)
    documents_absent = models.PositiveIntegerField(default=0, help_text="404: already gone, counted as done.")
    documents_referenced = models.PositiveIntegerField(
        default=0, help_text="Skipped: a remaining record (of any kind) still names the document. Never deleted."
    )
    documents_held = models.PositiveIntegerField(
        default=0, help_text="Set aside: an active legal hold covered the deleted records' scope before the purge."
    )
    # The set-aside documents not yet handed to a later purge (emptied when a
    # sweep finds their hold released and re-queues them as a new request).
    held_document_ids = models.JSONField(default=list, blank=True)
    # A re-queued request: the original (its key is the batch's operation id,
    # whose ledger row gives the deleted records' id range).
    origin = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="requeues")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            # Each sweep trigger looks for set-aside documents whose hold is gone.
            models.Index(fields=["id"], condition=Q(documents_held__gt=0), name="purge_request_held_idx"),
        ]

    def __str__(self) -> str:
        return f"Purge request {self.key[:12]}"


class DeletedAttachment(models.Model):
    """A deleted record named this document: written in the deleting batch's
    transaction, one row per record (never two: a record is deleted once).

    What the purge of a document asks about (``downstream.purge``): an
    active hold over *any* record that named the document — of any kind,
    property or portfolio, deleted by any batch — keeps the file. Record ids
    are kept so that a record-level hold is matched exactly; rows written
    before record ids were kept have none and match any record-level hold of
    their scope (keep a file too many, never one too few).
    """

    document_id = models.CharField(max_length=DOCUMENT_REF_MAX_LENGTH)
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField(null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    record_id = models.BigIntegerField(null=True, blank=True)
    # A non-integer key, as text (record_id is then NULL).
    record_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    purge_request = models.ForeignKey(PurgeRequest, on_delete=models.PROTECT, related_name="attachments")
    deleted_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["document_id"], name="deleted_attachment_doc_idx")]
        constraints = [
            models.UniqueConstraint(fields=["record_kind", "record_id"], name="deleted_attachment_one_per_record"),
            models.UniqueConstraint(
                fields=["record_kind", "record_key"], condition=~Q(record_key=""), name="deleted_attachment_one_per_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.record_kind} {self.record_id} named {self.document_id}"


class DispositionState(models.TextChoices):
    PENDING = "pending", "Pending"  # no decision yet (or only "still referenced")
    SET_ASIDE = "set_aside", "Set aside under a legal hold"
    PURGED = "purged", "Purged"  # final: the store deleted it (or had no such document)


class DocumentDisposition(models.Model):
    """The one purge decision per document id: its row is the lock every
    purge of that document takes (``FOR UPDATE``), whichever request, scope
    or portfolio it comes from, and ``purged`` is final, so no document is
    deleted twice and none through another record's request while a hold
    keeps it."""

    State = DispositionState

    document_id = models.CharField(max_length=DOCUMENT_REF_MAX_LENGTH, unique=True)
    state = models.CharField(max_length=12, choices=DispositionState.choices, default=DispositionState.PENDING)
    # The request whose purge decided last (set aside or purged).
    decided_by = models.ForeignKey(
        PurgeRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="decisions"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.document_id}: {self.state}"


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

    job = models.OneToOneField(CleanupJob, on_delete=models.PROTECT, related_name="dead_letter")
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
    portfolio_id = models.BigIntegerField()
    property_id = models.BigIntegerField(null=True, blank=True)  # NULL: a kind without a property
    record_kind = models.CharField(max_length=40)
    policy_version_id = models.BigIntegerField()
    sweep = models.ForeignKey(Sweep, on_delete=models.PROTECT, related_name="dead_letters")
    status = models.CharField(max_length=10, choices=DeadLetterStatus.choices, default=DeadLetterStatus.OPEN)
    resolved_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_reason = models.TextField(blank=True, default="")
    redrive_job = models.OneToOneField(
        CleanupJob, null=True, blank=True, on_delete=models.PROTECT, related_name="redriven_from_letter"
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

    @property
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


class RateBucket(models.Model):
    """A token bucket shared by every worker process on every host.

    ``tokens`` as of ``updated_at`` (epoch seconds); refill is computed in the
    acquiring UPDATE itself, so there is no background refill process.
    """

    name = models.CharField(max_length=60, primary_key=True)
    tokens = models.FloatField()
    updated_at = models.FloatField()

    def __str__(self) -> str:
        return f"{self.name}: {self.tokens:.1f}"


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

    portfolio_id = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField()
    paused_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    paused_at = models.DateTimeField()
    resumed_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
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


class WorkerHeartbeat(models.Model):
    """One row per worker cluster, written by its own workers (``cleanup_ops.health``).

    A cluster is one ``qcluster`` process tree on one host, named by
    ``Q_CLUSTER_NAME``. ``pid`` is its sentinel (the parent of its workers):
    a new value means the cluster was restarted, and ``started_at`` restarts
    with it. ``last_progress_at`` is when one of its workers last finished a
    task. A cluster with due work it could take and no progress for a while is
    wedged, not idle (``cleanup_health --liveness``).
    """

    host = models.CharField(max_length=255)
    cluster = models.CharField(max_length=100)
    # The django-q2 queue the cluster serves (Q_CLUSTER_NAME); "" on rows
    # written before heartbeats named it (read as the main queue).
    queue = models.CharField(max_length=40, blank=True, default="", db_default="")
    pid = models.PositiveIntegerField(help_text="The cluster's sentinel process (parent of its workers).")
    started_at = models.DateTimeField(help_text="When this run of the cluster (this pid) spawned its first worker.")
    last_progress_at = models.DateTimeField(null=True, blank=True, help_text="When a worker last finished a task.")
    turns = models.PositiveBigIntegerField(default=0, help_text="Tasks finished by this run of the cluster.")
    jobs_leased = models.PositiveBigIntegerField(default=0, help_text="Jobs leased by this run of the cluster.")
    rows_deleted = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["host", "cluster"]
        constraints = [models.UniqueConstraint(fields=["host", "cluster"], name="heartbeat_one_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}@{self.host}"


def liveness_verdict(
    *, waited: float | None, heartbeat: WorkerHeartbeat | None, now: datetime, stale: float
) -> tuple[str, float | None]:
    """The one rule for "wedged", used by ``cleanup_health --liveness`` and the
    console's workers page: ("idle" | "working" | "wedged", seconds since the
    cluster's last progress or start). Idle: no due work it could take.
    Working: that work has waited less than ``stale``, or the cluster made
    progress (or started) less than ``stale`` ago. Otherwise wedged."""
    quiet = None
    if heartbeat is not None:
        reference = max(heartbeat.started_at, heartbeat.last_progress_at or heartbeat.started_at)
        quiet = (now - reference).total_seconds()
    if waited is None:
        return "idle", quiet
    if waited < stale or (quiet is not None and quiet < stale):
        return "working", quiet
    return "wedged", quiet


# Whole table partitions dropped: a ledger of their own (registered here so Django finds it).
from cleanup_ops.table_partition_ledger import TablePartitionDrop  # noqa: E402, F401
