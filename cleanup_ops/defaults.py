"""The pipeline's settings: each one's default and the rule its value must meet.

``CleanupOpsConfig`` fills in every one the project did not set
(``retention.conf.apply_defaults``); ``cleanup_ops.checks`` reports a value
that breaks its rule as a system check error naming the setting. The
defaults are the demo project's (``config/settings.py``, which reads them
from the environment); ``docs/configuration.md`` says what each one means.
"""

from __future__ import annotations

from typing import Any

from retention.conf import MAX_BATCH_SIZE, Setting, integer, ip_addresses, number, one_of, strings, text


def _cron(value: Any) -> str | None:
    from croniter import croniter

    if not isinstance(value, str) or not croniter.is_valid(value):
        return f"not a valid cron expression: {value!r}"
    return None


def _checkpoints(value: Any) -> str | None:
    return None if isinstance(value, frozenset | set) else f"expected a set of checkpoint names, got {value!r}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {value!r}"


def _optional_url(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected a URL or an empty string, got {value!r}"
    if value and not value.startswith(("http://", "https://")):
        return "expected http(s)://host[:port]"
    return None


def _docstore_url(value: Any) -> str | None:
    # The allowlists are checked with the other settings (cleanup_ops.checks),
    # where both are known; here only the type.
    return None if isinstance(value, str) else f"expected a URL or an empty string, got {value!r}"


def _any_string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, got {value!r}"


SETTINGS: tuple[Setting, ...] = (
    # --- the pipeline
    Setting("CLEANUP_SCHEDULE", "0 2 * * *", _cron),
    Setting("CLEANUP_BATCH_SIZE", MAX_BATCH_SIZE, integer(minimum=1, maximum=MAX_BATCH_SIZE)),
    Setting("CLEANUP_SLICE_BATCHES", 20, integer(minimum=1)),
    Setting("CLEANUP_SLICE_SECONDS", 5.0, number(minimum=0.1)),
    Setting("CLEANUP_LEASE_SECONDS", 60, integer(minimum=5)),
    Setting("CLEANUP_DISPATCH_WINDOW", 0, integer(minimum=0)),
    Setting("CLEANUP_LEASE_JOBS", 100, integer(minimum=1, maximum=1000)),
    Setting("CLEANUP_LEASE_LOCK_STRIPES", 16, integer(minimum=1, maximum=32)),
    Setting("CLEANUP_PORTFOLIO_MAX_LEASES", 2, integer(minimum=1)),
    Setting("CLEANUP_TOKEN_WAIT_SECONDS", 30.0, number()),
    # --- recovery: retries, budgets, rate limits
    Setting("CLEANUP_BACKOFF_BASE_SECONDS", 30.0, number()),
    Setting("CLEANUP_BACKOFF_CAP_SECONDS", 1800.0, number()),
    Setting("CLEANUP_MAX_ATTEMPTS", 5, integer(minimum=1)),
    Setting("CLEANUP_MAX_AGE_SECONDS", 6 * 3600, integer(minimum=60)),
    Setting("CLEANUP_RATE_GLOBAL", 0.0, number()),
    Setting("CLEANUP_BURST_GLOBAL", 50.0, number(minimum=1.0)),
    Setting("CLEANUP_RATE_PORTFOLIO", 0.0, number()),
    Setting("CLEANUP_BURST_PORTFOLIO", 20.0, number(minimum=1.0)),
    # --- the document store
    Setting("DOCSTORE_ALLOWED_SCHEMES", ["http", "https"], strings),
    Setting("DOCSTORE_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "::1"], strings),
    Setting("DOCSTORE_URL", "", _docstore_url),
    Setting("DOCSTORE_CONNECT_TIMEOUT", 2.0, number(minimum=0.01)),
    Setting("DOCSTORE_READ_TIMEOUT", 5.0, number(minimum=0.01)),
    Setting("DOCSTORE_CLOCK_SKEW_SECONDS", 1.0, number()),
    Setting("DOCSTORE_RATE_GLOBAL", 0.0, number()),
    Setting("DOCSTORE_BURST_GLOBAL", 10.0, number(minimum=1.0)),
    Setting("DOCSTORE_RATE_PORTFOLIO", 0.0, number()),
    Setting("DOCSTORE_BURST_PORTFOLIO", 5.0, number(minimum=1.0)),
    # --- attachments in Django storages (cleanup_ops.downstream.stores)
    Setting("STORAGE_PURGE_CONNECT_TIMEOUT", 2.0, number(minimum=0.01)),
    Setting("STORAGE_PURGE_READ_TIMEOUT", 5.0, number(minimum=0.01)),
    Setting("STORAGE_PURGE_BATCH_SIZE", 1000, integer(minimum=1, maximum=1000)),
    # --- workers and brokers (django-q2's own Q_CLUSTER is the project's: cleanup_ops.checks)
    Setting("Q_BROKER", "orm", one_of("orm", "redis", "sqs", "rabbitmq")),
    Setting(
        "Q_PURGE_CLUSTER", "retention-purge", text(r"[a-z0-9][a-z0-9-]{0,39}", "1 to 40 of a-z 0-9 - (a queue name)")
    ),
    Setting("Q_PURGE_WORKERS", 2, integer(minimum=1, maximum=64)),
    Setting("Q_SQS_ENDPOINT_URL", "", _optional_url),
    Setting("Q_SQS_QUEUE_PREFIX", "", text(r"[A-Za-z0-9_-]{0,30}", "up to 30 of A-Z a-z 0-9 _ -")),
    Setting("Q_AMQP_URL", "", _any_string),
    Setting("Q_AMQP_DEAD_LETTER_MAX", 10000, integer(minimum=1)),
    # --- worker health, the scaled-to-zero fleet
    Setting("CLEANUP_CLUSTER_NAME", "default", text(r".{1,100}", "1 to 100 characters")),
    Setting("CLEANUP_HEARTBEAT_SECONDS", 5.0, number()),
    Setting("CLEANUP_LIVENESS_STALE_SECONDS", 120, integer(minimum=5)),
    Setting("CLEANUP_IDLE_EXIT_SECONDS", 300.0, number(minimum=1.0)),
    # --- clock, checkpoints and bounded waits
    Setting("CLEANUP_CLOCK_SYNC_SECONDS", 30.0, number()),
    Setting("CLEANUP_SCOPE_LOCK_WAIT_SECONDS", 10.0, number(minimum=0.1)),
    Setting("CLEANUP_IDLE_IN_TRANSACTION_SECONDS", 30.0, number(minimum=1.0)),
    Setting("CLEANUP_TABLE_PARTITION_LOCK_SECONDS", 3.0, number(minimum=0.1)),
    Setting("CLEANUP_TABLE_PARTITION_PAUSE_RATIO", 4.0, number()),
    Setting("CLEANUP_TABLE_PARTITION_PAUSE_SECONDS", 2.0, number()),
    Setting("CLEANUP_CHECKPOINTS", frozenset(), _checkpoints),
    # --- the batch transaction's statements (execution.batches.batch_cursor)
    Setting("CLEANUP_PREPARED_STATEMENTS", True, _boolean),
    # --- the console's and the admin's sessions (cleanup_ops.middleware)
    Setting("CONSOLE_SESSION_IDLE_SECONDS", 30 * 60, integer(minimum=60, maximum=24 * 3600)),
    # --- the API's tokens (cleanup_ops.api_tokens): a new token's lifetime
    Setting("API_TOKEN_TTL_DAYS", 90, integer(minimum=1, maximum=3650)),
    # --- /metrics
    Setting("METRICS_TOKEN", "", _any_string),
    Setting("METRICS_ALLOWED_IPS", [], ip_addresses),
    # --- proofs of disposition: the signing key (cleanup_ops.proof_keys; its
    # value's rules, which read the key, are the check cleanup_ops.E120's)
    Setting("RETENTION_PROOF_SIGNING_KEY", "", _any_string),
    Setting("RETENTION_PROOF_KEY_ID", "", _any_string),
    Setting("RETENTION_PROOF_PUBLIC_KEYS", "", _any_string),
)
