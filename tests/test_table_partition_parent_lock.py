"""The parent's ACCESS EXCLUSIVE lock of a table-partition drop, held for the
catalog change alone (``cleanup_ops.table_partitions._lock_parent_and_drop``).

Every read and write of the partitioned table waits while the drop holds its
parent's lock, so the drop takes it last — after every read it decides on — and
sends the ``DROP TABLE`` with it: from the grant to the commit, nothing else.
The world and its helpers are ``tests/test_table_partitions.py``'s.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection, transaction

from cleanup_ops import table_partitions as service
from cleanup_ops.models import TablePartitionDrop
from properties.models import TenantActivity

from .interleaving import CheckpointHold, poll, raw_connection
from .test_table_partitions import (
    NOW,
    P_APRIL,
    P_MARCH,
    SLOT,
    TABLE,
    build_world,
    committed,  # noqa: F401 - the fixture, used by name
    committed_world,
    drop_in_thread,
    march_dropped,
    table_partition_exists,
)

# Drops and reads tenant activity's table partitions: made again around each test (tests/conftest.py).
pytestmark = pytest.mark.table_partitions


@pytest.mark.django_db(transaction=True)
def test_the_statement_that_takes_the_parents_lock_drops_the_table_partition_and_the_commit_comes_next(
    committed,  # noqa: F811 - the fixture imported above
    active_policy,
):
    """The drop's statements in order, with the commit marked where it ran:
    each one that asks for the parent's lock carries the ``DROP TABLE``, and
    the one that got it is followed by the commit, no statement between (the
    savepoint of the try is released by the commit, not by a round trip of its
    own while every reader of the parent waits)."""
    build_world(active_policy)
    seen: list[str] = []

    def record(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        text = sql.as_string(connection.connection) if hasattr(sql, "as_string") else str(sql)
        result = execute(sql, params, many, context)
        seen.append(text)
        if "ACCESS EXCLUSIVE" in text:
            transaction.on_commit(lambda: seen.append("COMMIT"))
        return result

    with connection.execute_wrapper(record):
        (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds

    assert (kind.dropped[P_MARCH], kind.dropped[P_APRIL]) == (7, 2)
    locking = [i for i, text in enumerate(seen) if "ACCESS EXCLUSIVE" in text]
    assert len(locking) == len(kind.dropped)
    for i in locking:
        assert "NOWAIT" in seen[i] and "DROP TABLE" in seen[i]
        assert seen[i + 1] == "COMMIT", seen[i : i + 3]


@pytest.mark.django_db(transaction=True)
def test_at_the_drops_last_checkpoint_it_holds_no_lock_on_the_parent_and_a_read_of_it_goes_on(
    committed,  # noqa: F811 - the fixture imported above
    active_policy,
):
    """At ``before_drop`` every read is done, the ledger row written, and the
    drop holds nothing on the partitioned table itself: a second connection's
    read of it runs to its end while the drop stands there."""
    committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.before_drop"})
    hold = CheckpointHold("table_partition.before_drop")
    drop = drop_in_thread()
    observer = raw_connection()
    try:
        pid = hold.wait_for_worker(drop)
        locks = observer.execute(
            "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.pid = %s"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [pid],
        ).fetchall()
        assert (P_MARCH, "ShareLock") in locks  # the table partition's: no row enters or leaves it
        assert [mode for name, mode in locks if name == TABLE] == []
        assert observer.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0] > 0
    finally:
        hold.release()
        observer.close()
    drop.join()
    drop.reraise()
    assert march_dropped() and not table_partition_exists(P_MARCH)


@pytest.mark.django_db(transaction=True)
def test_a_reader_holding_the_parent_makes_the_drop_ask_again_and_it_drops_once_the_reader_is_done(
    committed,  # noqa: F811 - the fixture imported above
    active_policy,
):
    """A refused NOWAIT rolls back to its savepoint only: the ledger row and
    the locks stay, the drop asks again, and once the reader's transaction
    ends it drops the table partition with its ledger row."""
    world = committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.before_drop"})
    committed.CLEANUP_TABLE_PARTITION_LOCK_SECONDS = 30.0
    hold = CheckpointHold("table_partition.before_drop")
    drop = drop_in_thread()
    reader = raw_connection(autocommit=False)
    observer = raw_connection()
    try:
        pid = hold.wait_for_worker(drop)
        reader.execute(f"SELECT count(*) FROM {TABLE}").fetchone()  # holds the parent's ACCESS SHARE
        hold.release()

        def refused() -> bool:
            # Between tries (PARENT_LOCK_RETRY_SECONDS) its last statement is the
            # rollback to the refused try's savepoint; before the first try it was
            # the check for waiting sessions.
            row = observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            return bool(row) and row[0].startswith("ROLLBACK TO SAVEPOINT")

        poll(refused, what="the drop's NOWAIT refused while the reader holds the parent")
        # Never queued: it waits for nothing, and the reader's read of the parent goes on.
        assert observer.execute("SELECT pg_blocking_pids(%s)", [pid]).fetchone()[0] == []
        assert reader.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0] > 0
        assert table_partition_exists(P_MARCH) and not march_dropped()
    finally:
        hold.release()
        reader.rollback()
        reader.close()
        observer.close()
    drop.join()
    drop.reraise()
    (kind,) = drop.result.kinds
    assert kind.dropped[P_MARCH] == 7 and not kind.busy
    entry = TablePartitionDrop.objects.get(table_partition=P_MARCH)
    assert entry.rows == 7 and not table_partition_exists(P_MARCH)
    assert not TenantActivity.objects.filter(pk__in=world.march_ids()).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("ratio", "floor"), [(0.0, 0.0), (3.0, 0.0), (0.0, 1.5), (3.0, 1.5)])
def test_the_drops_pause_between_table_partitions_the_ratio_times_the_last_transaction_and_at_least_the_floor(
    committed,  # noqa: F811 - the fixture imported above
    active_policy,
    monkeypatch,
    ratio,
    floor,
):
    """``CLEANUP_TABLE_PARTITION_PAUSE_RATIO`` and ``_PAUSE_SECONDS``: after
    each drop but the last, before the next table partition's transaction, a
    pause of at least the ratio times the drop (measured here from its first
    statement to its commit, inside the span the code measures) and at least
    the floor (each drop makes every session of the table plan again: a cost
    per drop, not per second of it); none when both are 0. Every table
    partition here past the cutoff is dropped (no hold)."""
    committed_world(active_policy)
    committed.CLEANUP_TABLE_PARTITION_PAUSE_RATIO = ratio
    committed.CLEANUP_TABLE_PARTITION_PAUSE_SECONDS = floor
    events: list[tuple[str, float]] = []
    monkeypatch.setattr(service, "_pause", lambda seconds: events.append(("pause", seconds)))

    def record(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if "set_config('lock_timeout'" in str(sql):
            events.append(("begin", time.perf_counter()))
            transaction.on_commit(lambda: events.append(("end", time.perf_counter())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds

    assert (kind.dropped[P_MARCH], kind.dropped[P_APRIL]) == (7, 2)
    transactions = [at for what, at in events if what == "begin"]
    pauses = [i for i, (what, _) in enumerate(events) if what == "pause"]
    if not ratio and not floor:
        assert pauses == [] and len(transactions) >= 2
        return
    # One pause between each two transactions, none before the first or after the last.
    assert [events[i - 1][0] for i in pauses] == ["end"] * (len(transactions) - 1)
    assert [events[i + 1][0] for i in pauses] == ["begin"] * (len(transactions) - 1)
    for i in pauses:
        begun = max(at for what, at in events[:i] if what == "begin")
        assert events[i][1] >= ratio * (events[i - 1][1] - begun)
        assert events[i][1] >= floor


@pytest.mark.django_db
def test_no_pause_inside_a_callers_transaction_whose_locks_would_stay_anyway(settings, active_policy, monkeypatch):
    build_world(active_policy)
    settings.CLEANUP_TABLE_PARTITION_PAUSE_RATIO = 3.0
    settings.CLEANUP_TABLE_PARTITION_PAUSE_SECONDS = 1.5
    pauses: list[float] = []
    monkeypatch.setattr(service, "_pause", pauses.append)

    (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds

    assert (kind.dropped[P_MARCH], kind.dropped[P_APRIL]) == (7, 2) and pauses == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "mode",
    [
        "SHARE UPDATE EXCLUSIVE",  # what an autovacuum or an ANALYZE of it holds
        "ACCESS SHARE",  # a read of that table partition by its own name
        "ROW EXCLUSIVE",  # a write to it by its own name
    ],
)
def test_a_session_holding_another_table_partition_does_not_make_the_drop_busy(
    committed,  # noqa: F811 - the fixture imported above
    active_policy,
    mode,
):
    """The drop locks the parent ONLY: the other table partitions' locks are not
    the drop's to take, so a session holding one (in any mode a vacuum, a read
    or a write takes) leaves the drop to go on, and is left alone by it."""
    committed_world(active_policy)
    committed.CLEANUP_TABLE_PARTITION_LOCK_SECONDS = 0.5
    other = raw_connection(autocommit=False)
    try:
        other.execute(f"LOCK TABLE {TABLE}_2026_08 IN {mode} MODE")
        (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds
        assert not kind.busy, kind.busy
        assert (kind.dropped[P_MARCH], kind.dropped[P_APRIL]) == (7, 2)
    finally:
        other.rollback()
        other.close()
    assert march_dropped() and not table_partition_exists(P_MARCH)
