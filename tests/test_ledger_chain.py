"""The ledger's hash chains (issue 39, item 2; ``cleanup_ops.ledger_chain``).

Every ledger row is linked to its portfolio's chain by the database as the
batch inserts it, and every table-partition drop to the drops' chain; ``manage.py
cleanup_ledger_verify`` walks them and names the first row removed, altered
or reordered. Real PostgreSQL throughout: the trigger and its lock are the
database's, and two batches of one portfolio race on two real connections.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from cleanup_ops import table_partitions as drops_service
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.ledger_chain import DROPS_CHAIN, backfill, portfolio_chain, verify_chains
from cleanup_ops.models import CleanupJob, LedgerChainHead, LedgerEntry, Sweep, TablePartitionDrop
from cleanup_ops.proof import proof_sign, sweep_proof
from cleanup_ops.proof_keys import proof_public_keys
from cleanup_ops.proof_verify import LEDGER_ENTRY_PARTS, ledger_entry_hash, verify, verify_digests
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property

from .conftest import make_records, utc
from .interleaving import CheckpointHold, InThread, poll, raw_connection

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")


def drained(portfolio: Portfolio, prop: Property, active_policy: Any, *, rows: int = 5, batch: int = 2) -> Sweep:
    """A sweep of two partitions of ``portfolio`` (leases of ``prop``, maintenance of a
    second property) drained in batches of ``batch``."""
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    make_records(prop, "lease", rows, ended=OLD)
    second = Property.objects.create(portfolio=portfolio, name="Quay Court")
    make_records(second, "maintenance_record", 3, ended=OLD)
    sweep_trigger(slot=SLOT)
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, batch_size=batch)
    return Sweep.objects.get()


def verify_command(*args: str) -> tuple[int, str, dict[str, Any]]:
    """``cleanup_ledger_verify``'s exit status, output and JSON summary."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("cleanup_ledger_verify", "--json", *args, stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    text = out.getvalue()
    return code, text, json.loads(text.strip().splitlines()[-1])


def as_privileged_user(statement: str, params: list[Any]) -> None:
    """A change made behind the application's back, in SQL (as a DBA would)."""
    with connection.cursor() as cur:
        cur.execute(statement, params)


@pytest.fixture
def swept(portfolio, prop, active_policy, time_machine) -> Sweep:  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return drained(portfolio, prop, active_policy)


@pytest.mark.django_db
def test_a_drained_sweeps_chain_verifies_row_by_row_and_ends_at_its_head(swept, portfolio) -> None:
    entries = list(LedgerEntry.objects.order_by("id"))
    assert len(entries) == 3 + 2
    # Linked in id order, the first to nothing.
    assert (entries[0].prev_id, entries[0].prev_hash) == (None, "")
    for before, after in itertools.pairwise(entries):
        assert (after.prev_id, after.prev_hash) == (before.id, before.entry_hash)
    # The database's hash is the verifier's formula.
    for entry in entries:
        fields = {name: getattr(entry, name) for name in LEDGER_ENTRY_PARTS}
        assert ledger_entry_hash(fields) == entry.entry_hash
    head = LedgerChainHead.objects.get(chain=portfolio_chain(portfolio.pk))
    assert (head.entry_id, head.entry_hash, head.entries) == (entries[-1].id, entries[-1].entry_hash, 5)
    code, text, summary = verify_command()
    assert code == 0, text
    assert (summary["ok"], summary["chains"], summary["rows"]) == (True, 1, 5)
    assert verify_command("--portfolio", str(portfolio.pk))[0] == 0


@pytest.mark.django_db
def test_a_group_transaction_writing_several_rows_of_one_portfolio_links_them_one_after_another(
    portfolio, active_policy, time_machine
) -> None:
    """Many small partitions of one portfolio share a transaction: its one
    ledger insert writes several rows of one chain, each linked to the one
    the trigger linked before it in that same statement."""
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    for n in range(4):
        make_records(Property.objects.create(portfolio=portfolio, name=f"Court {n}"), "lease", 2, ended=OLD)
    sweep_trigger(slot=SLOT)
    cleanup_drain()
    entries = list(LedgerEntry.objects.order_by("id"))
    assert len(entries) == 4
    assert len({e.applied_at for e in entries}) < len(entries), "no transaction wrote two ledger rows"
    for before, after in itertools.pairwise(entries):
        assert (after.prev_id, after.prev_hash) == (before.id, before.entry_hash)
    report = verify_chains()
    assert report.ok and (report.chains, report.rows) == (1, 4), report.problems


@pytest.mark.django_db
def test_a_ledger_row_deleted_from_the_middle_or_the_end_is_named_by_the_command(swept) -> None:
    ids = list(LedgerEntry.objects.order_by("id").values_list("id", flat=True))
    as_privileged_user("DELETE FROM cleanup_ops_ledgerentry WHERE id = %s", [ids[2]])
    code, text, summary = verify_command()
    assert code == 1
    assert summary["first_row"] == ids[2]
    assert f"row {ids[2]} was removed" in text
    # The last row: the head still names it.
    as_privileged_user("DELETE FROM cleanup_ops_ledgerentry WHERE id = %s", [ids[-1]])
    report = verify_chains()
    assert f"row {ids[-1]} was removed (the chain's head names it)" in "\n".join(report.problems)


@pytest.mark.django_db
def test_a_ledger_rows_count_changed_by_update_is_named_and_so_is_one_rehashed_by_whoever_changed_it(swept) -> None:
    ids = list(LedgerEntry.objects.order_by("id").values_list("id", flat=True))
    as_privileged_user("UPDATE cleanup_ops_ledgerentry SET rows_deleted = rows_deleted + 1 WHERE id = %s", [ids[1]])
    code, text, summary = verify_command()
    assert code == 1
    assert summary["first_row"] == ids[1]
    assert f"row {ids[1]} was altered (its hash does not recompute)" in text
    # Re-hashed with the published formula: the next row still holds the old hash.
    entry = LedgerEntry.objects.get(pk=ids[1])
    rehashed = ledger_entry_hash({name: getattr(entry, name) for name in LEDGER_ENTRY_PARTS})
    as_privileged_user("UPDATE cleanup_ops_ledgerentry SET entry_hash = %s WHERE id = %s", [rehashed, ids[1]])
    report = verify_chains()
    assert report.first_row == ids[1]
    assert f"row {ids[1]} was altered (row {ids[2]} holds another hash for it)" in report.problems[0]


@pytest.mark.django_db
def test_ledger_rows_reordered_by_swapping_their_ids_are_named_at_the_first(swept) -> None:
    ids = list(LedgerEntry.objects.order_by("id").values_list("id", flat=True))
    a, b = ids[1], ids[2]
    for old, new in ((a, -1), (b, a), (-1, b)):
        as_privileged_user("UPDATE cleanup_ops_ledgerentry SET id = %s WHERE id = %s", [new, old])
    code, text, summary = verify_command()
    assert code == 1
    assert summary["first_row"] == a
    assert f"row {a} was reordered" in text


@pytest.mark.django_db
def test_a_portfolios_chain_is_verified_alone_and_another_portfolios_tampering_is_not_its(
    swept, portfolio, active_policy, time_machine
) -> None:
    time_machine.move_to(utc("2026-08-22T02:05:00Z"), tick=False)
    other = Portfolio.objects.create(name="Other", slug="other")
    active_policy(other, "lease", 365)
    make_records(Property.objects.create(portfolio=other, name="Far Lane"), "lease", 2, ended=OLD)
    sweep_trigger(slot=utc("2026-08-22T02:00:00Z"))
    for job in CleanupJob.objects.filter(portfolio_id=other.pk):
        job_run_slice(job_id=job.pk, batch_size=1)
    theirs = LedgerEntry.objects.filter(portfolio_id=other.pk).order_by("id").first()
    assert theirs is not None and theirs.prev_id is None  # its own chain, not linked to ours
    as_privileged_user("UPDATE cleanup_ops_ledgerentry SET rows_held = 7 WHERE id = %s", [theirs.pk])
    assert verify_command("--portfolio", str(portfolio.pk))[0] == 0
    code, _, summary = verify_command("--portfolio", str(other.pk))
    assert (code, summary["first_row"]) == (1, theirs.pk)


@pytest.mark.django_db
def test_a_row_inserted_with_an_id_before_its_chains_head_draws_a_new_one_and_the_chain_stays_in_id_order(
    swept, portfolio
) -> None:
    first = LedgerEntry.objects.order_by("id").first()
    assert first is not None
    fields = {
        name: getattr(first, name)
        for name in LEDGER_ENTRY_PARTS
        if name not in ("id", "prev_id", "prev_hash", "operation_id")
    }
    late = LedgerEntry.objects.create(id=first.pk - 1 if first.pk > 1 else 1, operation_id="f" * 64, **fields)
    late.refresh_from_db()
    head = LedgerChainHead.objects.get(chain=portfolio_chain(portfolio.pk))
    assert late.pk > first.pk and head.entry_id == late.pk
    assert verify_chains().ok


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_batches_of_one_portfolio_leave_one_unforked_chain(
    portfolio, prop, active_policy, settings, time_machine
) -> None:
    """Batch A holds its chain's head (its ledger row written, not committed:
    held at ``batch.before_commit``); batch B of another property of the same
    portfolio waits for that head in its own ledger insert, and links to A's
    row once A commits."""
    time_machine.move_to(NOW, tick=False)
    active_policy(portfolio, "lease", 365)
    second = Property.objects.create(portfolio=portfolio, name="Quay Court")
    make_records(prop, "lease", 3, ended=OLD)
    make_records(second, "lease", 3, ended=OLD)
    sweep_trigger(slot=SLOT)
    first_job, second_job = CleanupJob.objects.order_by("id")
    settings.CLEANUP_CHECKPOINTS = frozenset({"batch.before_commit"})
    hold = CheckpointHold("batch.before_commit")
    observer = raw_connection()
    try:
        a = InThread(lambda: job_run_slice(job_id=first_job.pk, batch_size=10, max_batches=1), name="batch-a")
        a_pid = hold.wait_for_worker(a)
        b = InThread(lambda: job_run_slice(job_id=second_job.pk, batch_size=10, max_batches=1), name="batch-b")

        def b_waits_for_a() -> bool:
            (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [b.pid]).fetchone()
            return a_pid in blockers

        poll(b_waits_for_a, what="batch B's ledger insert to wait for batch A's chain head")
        (query,) = observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [b.pid]).fetchone()
        assert "INSERT INTO" in query  # waiting in the ledger insert, on the head's row lock
        hold.release()
        a.join()
        b.join()
        a.reraise()
        b.reraise()
    finally:
        hold.release()
        observer.close()
        settings.CLEANUP_CHECKPOINTS = frozenset()
    entries = list(LedgerEntry.objects.filter(portfolio_id=portfolio.pk).order_by("id"))
    assert [e.job_id for e in entries] == [first_job.pk, second_job.pk]
    assert (entries[1].prev_id, entries[1].prev_hash) == (entries[0].id, entries[0].entry_hash)
    assert LedgerEntry.objects.filter(portfolio_id=portfolio.pk, prev_id__isnull=True).count() == 1
    head = LedgerChainHead.objects.get(chain=portfolio_chain(portfolio.pk))
    assert (head.entry_id, head.entries) == (entries[1].id, 2)
    assert verify_chains().ok


@pytest.mark.table_partitions
@pytest.mark.django_db
def test_table_partition_drops_are_one_chain_of_their_own_named_by_the_proof_and_a_changed_drop_is_named(
    active_policy, time_machine
) -> None:
    from .test_table_partitions import KIND, build_world

    build_world(active_policy)
    time_machine.move_to(NOW, tick=False)
    sweep = sweep_trigger(slot=SLOT, now=NOW).sweep
    drops = list(TablePartitionDrop.objects.order_by("id"))
    assert drops and all(d.sweep_id == sweep.pk for d in drops)
    heads = sweep_proof(sweep=sweep)["ledger_heads"]
    assert heads[-1] == {"chain": DROPS_CHAIN, "entry_id": drops[-1].pk, "entry_hash": drops[-1].entry_hash}
    # A second run finds nothing more to drop: the chain is unchanged.
    assert not any(kind.dropped for kind in drops_service.table_partitions_drop(slot=SLOT, now=NOW).kinds)
    assert len(drops) >= 2 and all(d.record_kind == KIND for d in drops)
    assert (drops[0].prev_id, drops[0].prev_hash) == (None, "")
    for before, after in itertools.pairwise(drops):
        assert (after.prev_id, after.prev_hash) == (before.id, before.entry_hash)
    head = LedgerChainHead.objects.get(chain=DROPS_CHAIN)
    assert (head.entry_id, head.entries) == (drops[-1].id, len(drops))
    assert verify_chains().ok
    as_privileged_user("UPDATE cleanup_ops_tablepartitiondrop SET rows = rows - 1 WHERE id = %s", [drops[0].pk])
    report_after = verify_chains()
    assert report_after.first_row == drops[0].pk
    assert f"{DROPS_CHAIN}: row {drops[0].pk} was altered" in report_after.problems[0]


@pytest.mark.django_db
def test_the_backfill_links_rows_written_before_the_chain_in_id_order_as_the_trigger_would(swept) -> None:
    """Rows as migration 0022 finds them on an existing database: no link,
    no hash, no head. The backfill gives each the link and hash the trigger
    gave it."""
    linked = {e.pk: (e.prev_id, e.prev_hash, e.entry_hash) for e in LedgerEntry.objects.all()}
    as_privileged_user("UPDATE cleanup_ops_ledgerentry SET prev_id = NULL, prev_hash = NULL, entry_hash = NULL", [])
    as_privileged_user("DELETE FROM cleanup_ops_ledgerchainhead", [])
    unlinked = verify_chains()
    assert not unlinked.ok and "is not linked" in unlinked.problems[0]
    assert backfill() == len(linked)
    assert {e.pk: (e.prev_id, e.prev_hash, e.entry_hash) for e in LedgerEntry.objects.all()} == linked
    assert verify_chains().ok
    assert backfill() == 0  # nothing left to link


@pytest.mark.django_db
def test_migration_0022_on_a_database_with_ledger_rows_links_them_as_the_trigger_did(swept) -> None:
    """An existing database: the rows exist before the chain. Migrated back to
    0021 (the columns, the head table and the functions gone) and forward
    again, the migration's backfill gives every row the link and hash it had.
    The test's transaction rolls the DDL back with the rest (PostgreSQL's DDL
    is transactional)."""
    from django.db.migrations.executor import MigrationExecutor

    linked = {e.pk: (e.prev_id, e.prev_hash, e.entry_hash) for e in LedgerEntry.objects.all()}
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("cleanup_ops")
    with connection.cursor() as cur:
        # The fixture's deferred foreign-key checks, run now: an ALTER TABLE refuses pending ones.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    executor = MigrationExecutor(connection)
    executor.migrate([("cleanup_ops", "0021_canonical_document_refs")])
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('cleanup_ops_ledgerchainhead') IS NULL")
        assert cur.fetchone()[0]
    MigrationExecutor(connection).migrate(latest)
    assert {e.pk: (e.prev_id, e.prev_hash, e.entry_hash) for e in LedgerEntry.objects.all()} == linked
    assert verify_chains().ok


@pytest.mark.django_db
def test_the_proof_names_its_chain_head_under_the_signature_and_an_edited_head_fails(swept, portfolio) -> None:
    proof = proof_sign(proof=sweep_proof(sweep=swept))
    last = LedgerEntry.objects.order_by("id").last()
    assert last is not None
    assert proof["ledger_heads"] == [
        {"chain": portfolio_chain(portfolio.pk), "entry_id": last.pk, "entry_hash": last.entry_hash}
    ]
    keys = proof_public_keys()
    report = verify(proof, keys=keys)
    assert report.ok, report.problems
    assert report.chained == 5
    edited = json.loads(json.dumps(proof))
    edited["ledger_heads"][0]["entry_hash"] = "0" * 64
    failed = verify(edited, keys=keys)
    assert any(p.startswith("signature:") for p in failed.problems)
    assert any("the head named is row" in p for p in failed.problems)
    # A row's count edited in the proof: its hash no longer recomputes (digests alone, no signature).
    changed = json.loads(json.dumps(proof))
    changed["partitions"][0]["operation_inputs"][0]["ledger"]["rows_deleted"] += 1
    problems = verify_digests(changed).problems
    assert any("hash recomputes to" in p for p in problems), problems


@pytest.mark.django_db
def test_the_csv_proof_names_the_heads_too(swept, portfolio) -> None:
    from cleanup_ops.proof import proof_csv
    from cleanup_ops.proof_verify import load

    proof = sweep_proof(sweep=swept)
    text = proof_csv(proof)
    last = LedgerEntry.objects.order_by("id").last()
    assert last is not None
    assert f"# ledger_head {portfolio_chain(portfolio.pk)} {last.pk} {last.entry_hash}\n" in text
    assert load(text)["ledger_heads"] == [
        {"chain": portfolio_chain(portfolio.pk), "entry_id": str(last.pk), "entry_hash": last.entry_hash}
    ]
