"""Named checkpoints: places in the batch, purge, lease, redrive and pause paths
where a test can hold a worker, so that every interleaving of a worker with
a concurrent actor can be enumerated rather than hoped for.

Protocol: ``checkpoint(name)`` does nothing unless ``name`` is in
the test-only setting ``CLEANUP_CHECKPOINTS`` (empty in production: the cost
is one set lookup). When it is, the worker takes and at once releases the
session advisory lock ``(CHECKPOINT_NAMESPACE, checkpoint_key(name))`` on a
*side* connection of its own. A test that holds that lock (``hold`` in
``tests/interleaving.py``) therefore stops the worker exactly there: its main
session stays *idle in transaction* with every lock it has taken, just as a
stalled process (a GC pause, SIGSTOP, a frozen VM) would leave it — so
PostgreSQL's idle-in-transaction backstop applies to it as in production. The
test sees the worker waiting in ``pg_locks`` (not by timing), runs the
concurrent actor on its own connection, and lets go.

The side connection is opened on first use with the default database's
settings and kept for the process (a thread gets its own).
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

from django.conf import settings
from django.db import connection

CHECKPOINT_NAMESPACE = 7402

# Every checkpoint the code passes, by path (the interleaving suite enumerates them).
BATCH = ("batch.after_fence", "batch.after_policy", "batch.before_delete", "batch.before_commit")
PURGE = (
    "purge.after_decision_lock",
    "purge.after_scope_lock",
    "purge.before_store_call",
    "purge.after_store_call",
)
LEASE = ("lease.after_cap_lock", "lease_group.after_stripe_locks")
REDRIVE = ("redrive.after_lock",)
PAUSE = ("pause.after_lock",)
ALL = BATCH + PURGE + LEASE + REDRIVE + PAUSE
# A whole table partition's drop (cleanup_ops.table_partitions; tests/test_table_partitions.py
# enumerates its actors): not a worker's path, so not in ALL.
TABLE_PARTITION = ("table_partition.before_lock", "table_partition.after_locks", "table_partition.before_drop")

_local = threading.local()


def checkpoint_key(name: str) -> int:
    """The advisory lock key of a checkpoint (a stable 31-bit hash of its name)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _side_connection() -> Any:
    side = getattr(_local, "side", None)
    if side is None or side.closed:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        side = psycopg.connect(**params, autocommit=True)
        side.execute("SET application_name = 'cleanup-checkpoint'")
        _local.side = side
    return side


def checkpoint(name: str) -> None:
    """Pass the checkpoint ``name`` (a no-op unless a test enabled it)."""
    if name not in settings.CLEANUP_CHECKPOINTS:
        return
    key = checkpoint_key(name)
    side = _side_connection()
    # The worker's own backend pid, so the test knows whose session to kill.
    pid = connection.connection.info.backend_pid if connection.connection is not None else 0
    side.execute("SELECT set_config('application_name', %s, false)", [f"cleanup-checkpoint:{name}:{pid}"])
    side.execute("SELECT pg_advisory_lock(%s, %s)", [CHECKPOINT_NAMESPACE, key])
    side.execute("SELECT pg_advisory_unlock(%s, %s)", [CHECKPOINT_NAMESPACE, key])


def close_side_connection() -> None:
    side = getattr(_local, "side", None)
    if side is not None:
        side.close()
        _local.side = None
