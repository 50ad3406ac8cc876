"""The cleanup pipeline's models, one module per part of its durable state.

- ``jobs``: sweeps, jobs (a queryset with each state predicate once) and the
  ledger; its docstring says what is the source of truth;
- ``outbox``: the purge's outbox and each document's disposition;
- ``interventions``: dead letters and pauses, what operators decide about;
- ``workers``: rate buckets and worker heartbeats;
- ``table_partitions``: the ledger of table partitions dropped whole.

Django finds an app's models in its ``models`` module, so each is imported
here, and code imports them from ``cleanup_ops.models``.
"""

from cleanup_ops.lifecycle import JobOutcome, JobState
from cleanup_ops.models.interventions import (
    DeadLetter,
    DeadLetterQuerySet,
    DeadLetterStatus,
    PipelinePause,
    PipelinePauseQuerySet,
    open_letter_q,
)
from cleanup_ops.models.jobs import (
    OPEN_STATES,
    SCOPE_FIELDS,
    CleanupJob,
    CleanupJobQuerySet,
    JobKind,
    LedgerEntry,
    Sweep,
    SweepQuerySet,
    SweepStatus,
    due_q,
    due_work_q,
    expired_lease_q,
    live_lease_q,
    not_waiting_in_broker_q,
    open_q,
    scope_of,
    superseded_q,
    unpaused_q,
)
from cleanup_ops.models.outbox import (
    DOCUMENT_REF_MAX_LENGTH,
    STORAGE_KEY_MAX_BYTES,
    STORE_ALIAS_MAX_LENGTH,
    DeletedAttachment,
    DispositionState,
    DocumentDisposition,
    DocumentSpelling,
    PurgeRequest,
)
from cleanup_ops.models.table_partitions import LedgerChainHead, TablePartitionDrop
from cleanup_ops.models.workers import (
    ClusterControl,
    ClusterMode,
    LimitName,
    RateBucket,
    RuntimeLimit,
    WorkerHeartbeat,
)

__all__ = [
    "DOCUMENT_REF_MAX_LENGTH",
    "OPEN_STATES",
    "SCOPE_FIELDS",
    "STORAGE_KEY_MAX_BYTES",
    "STORE_ALIAS_MAX_LENGTH",
    "CleanupJob",
    "CleanupJobQuerySet",
    "ClusterControl",
    "ClusterMode",
    "DeadLetter",
    "DeadLetterQuerySet",
    "DeadLetterStatus",
    "DeletedAttachment",
    "DispositionState",
    "DocumentDisposition",
    "DocumentSpelling",
    "JobKind",
    "JobOutcome",
    "JobState",
    "LedgerChainHead",
    "LedgerEntry",
    "LimitName",
    "PipelinePause",
    "PipelinePauseQuerySet",
    "PurgeRequest",
    "RateBucket",
    "RuntimeLimit",
    "Sweep",
    "SweepQuerySet",
    "SweepStatus",
    "TablePartitionDrop",
    "WorkerHeartbeat",
    "due_q",
    "due_work_q",
    "expired_lease_q",
    "live_lease_q",
    "not_waiting_in_broker_q",
    "open_letter_q",
    "open_q",
    "scope_of",
    "superseded_q",
    "unpaused_q",
]
