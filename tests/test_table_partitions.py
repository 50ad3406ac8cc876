"""Whole table partitions dropped when no hold can be in them (``cleanup_ops.table_partitions``).

The demo's tenant activity is monthly partitioned on PostgreSQL (properties
0006) and opts in. The world: portfolios A (properties A1, A2) and B (B1),
each with a 365-day tenant-activity policy; rows in March 2020 (A1, A2, B1),
April 2020 (A1) and October 2025 (A1, younger than the slot's cutoff
2025-08-21). Tests that only call the service run in a transaction that the
test's end rolls back, DDL included; the concurrency tests commit, and
conftest's ``_table_partitions_kept`` makes the table partitions they dropped
again after every committing test.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import DatabaseError, connection

from cleanup_ops import table_partitions as service
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import LedgerEntry, TablePartitionDrop
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property, TenantActivity
from retention.checks import check_kind, table_partition_shape_problems, table_partitions_check
from retention.models import RetentionPolicy
from retention.registry import registry_reload
from retention.services import legal_hold_place, policy_version_approve, policy_version_submit

from .conftest import make_records, make_user, table_partitions_listed, table_partitions_restore, utc
from .interleaving import CheckpointHold, InThread, raw_connection

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
MARCH = utc("2020-03-15T00:00:00Z")
APRIL = utc("2020-04-10T00:00:00Z")
YOUNG = utc("2025-10-05T00:00:00Z")
TABLE = "properties_tenantactivity"
P_MARCH = f"{TABLE}_2020_03"
P_APRIL = f"{TABLE}_2020_04"
P_YOUNG = f"{TABLE}_2025_10"
KIND = "tenant_activity"
SCOPES = ("portfolio", "property", "record_kind", "record")

# Drops and reads tenant activity's table partitions: made again around each test (tests/conftest.py).
pytestmark = pytest.mark.table_partitions


@dataclass
class World:
    a: Portfolio
    b: Portfolio
    a1: Property
    a2: Property
    b1: Property
    ids: dict[tuple[str, str], list[int]]  # (property name, month) -> ids

    def march_ids(self) -> list[int]:
        return sorted(i for (_, month), ids in self.ids.items() if month == "march" for i in ids)


def build_world(active_policy, *, b_days: int | None = 365, b_enabled: bool = True) -> World:  # type: ignore[no-untyped-def]
    a = Portfolio.objects.create(name="A", slug="a")
    b = Portfolio.objects.create(name="B", slug="b")
    a1 = Property.objects.create(portfolio=a, name="A1")
    a2 = Property.objects.create(portfolio=a, name="A2")
    b1 = Property.objects.create(portfolio=b, name="B1")
    active_policy(a, KIND, 365)
    if b_days is not None:
        active_policy(b, KIND, b_days, enabled=b_enabled)
    ids = {
        ("a1", "march"): make_records(a1, KIND, 3, ended=MARCH),
        ("a2", "march"): make_records(a2, KIND, 2, ended=MARCH),
        ("b1", "march"): make_records(b1, KIND, 2, ended=MARCH),
        ("a1", "april"): make_records(a1, KIND, 2, ended=APRIL),
        ("a1", "young"): make_records(a1, KIND, 2, ended=YOUNG),
    }
    return World(a=a, b=b, a1=a1, a2=a2, b1=b1, ids=ids)


@pytest.fixture
def world(active_policy) -> World:  # type: ignore[no-untyped-def]
    return build_world(active_policy)


def table_partition_exists(name: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return bool(cur.fetchone()[0])


def digest_of(ids: list[int]) -> str:
    """The ledger's ids digest, recomputed here: sha256 of the ids in id order, joined by ','."""
    return hashlib.sha256(",".join(str(i) for i in sorted(ids)).encode()).hexdigest()


def place(world: World, scope: str, *, reviewer, record_id: int | None = None):  # type: ignore[no-untyped-def]
    """A hold in portfolio A at ``scope`` (the record hold names ``record_id``, default A1's first March row)."""
    kwargs: dict = {"portfolio": world.a, "placed_by": reviewer, "reason": "litigation hold for the tests"}
    if scope == "property":
        kwargs["property"] = world.a1
    elif scope == "record_kind":
        kwargs["record_kind"] = KIND
    elif scope == "record":
        kwargs |= {"record_kind": KIND, "record_id": record_id or world.ids[("a1", "march")][0]}
    elif scope == "other_kind":
        kwargs["record_kind"] = "lease"
    return legal_hold_place(**kwargs)


def held_ids(world: World, scope: str) -> set[int]:
    """The March and April ids a hold at ``scope`` in portfolio A covers."""
    a1 = set(world.ids[("a1", "march")] + world.ids[("a1", "april")])
    if scope == "property":
        return a1
    if scope == "record":
        return {world.ids[("a1", "march")][0]}
    if scope == "other_kind":
        return set()
    return a1 | set(world.ids[("a2", "march")])


@pytest.mark.django_db
def test_a_table_partition_past_every_cutoff_with_no_hold_is_dropped_with_its_count_and_digest(world):
    report = service.table_partitions_drop(slot=SLOT, now=NOW)

    (kind,) = report.kinds
    assert kind.dropped[P_MARCH] == 7 and kind.dropped[P_APRIL] == 2
    assert P_YOUNG in kind.kept_young and not kind.busy and not kind.kept_held
    entry = TablePartitionDrop.objects.get(table_partition=P_MARCH)
    assert (entry.table, entry.record_kind, entry.rows) == (TABLE, KIND, 7)
    assert entry.ids_digest == digest_of(world.march_ids())
    assert (entry.lower_bound, entry.upper_bound) == (utc("2020-03-01T00:00:00Z"), utc("2020-04-01T00:00:00Z"))
    assert entry.portfolios == {
        str(world.a.pk): {
            "rows": 5,
            "policy_version_id": entry.portfolios[str(world.a.pk)]["policy_version_id"],
            "cutoff": "2025-08-21T02:00:00Z",
        },
        str(world.b.pk): {
            "rows": 2,
            "policy_version_id": entry.portfolios[str(world.b.pk)]["policy_version_id"],
            "cutoff": "2025-08-21T02:00:00Z",
        },
    }
    assert not table_partition_exists(P_MARCH) and not table_partition_exists(P_APRIL)
    assert not TenantActivity.objects.filter(pk__in=world.march_ids()).exists()
    # The young rows and their table partition are untouched, as is the default one.
    assert table_partition_exists(P_YOUNG) and table_partition_exists(f"{TABLE}_default")
    assert set(TenantActivity.objects.values_list("id", flat=True)) == set(world.ids[("a1", "young")])
    # An empty table partition past every cutoff goes too (count 0); the current month stays.
    assert kind.dropped[f"{TABLE}_2019_01"] == 0
    assert table_partition_exists(f"{TABLE}_2026_08")


@pytest.mark.django_db
@pytest.mark.parametrize("scope", [*SCOPES, "other_kind"])
def test_a_hold_at_any_scope_keeps_the_table_partition_and_the_row_deletes_keep_exactly_its_rows(
    world, reviewer, scope, time_machine
):
    time_machine.move_to(NOW, tick=False)
    place(world, scope, reviewer=reviewer)

    result = sweep_trigger(slot=SLOT, now=NOW)

    (kind,) = result.table_partitions.kinds  # type: ignore[union-attr]
    if scope == "other_kind":  # a hold of another kind cannot reach tenant activity
        assert P_MARCH in kind.dropped and P_APRIL in kind.dropped
        return
    assert {P_MARCH, P_APRIL} <= set(kind.kept_held) and P_MARCH not in kind.dropped
    assert table_partition_exists(P_MARCH) and not TablePartitionDrop.objects.filter(table_partition=P_MARCH)
    cleanup_drain()
    survivors = set(TenantActivity.objects.values_list("id", flat=True))
    old = set(world.march_ids()) | set(world.ids[("a1", "april")])
    assert survivors & old == held_ids(world, scope)  # held rows survive, unheld ones are deleted
    assert set(world.ids[("a1", "young")]) <= survivors
    assert LedgerEntry.objects.filter(record_kind=KIND).exists()  # by row deletes: the fallback


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("b_days", "b_enabled", "reason"),
    [(None, True, "kept_no_policy"), (365, False, "kept_no_policy"), (2500, True, "kept_young")],
    ids=["no_policy", "disabled_policy", "cutoff_before_the_upper_bound"],
)
def test_a_portfolio_without_an_enabled_policy_past_the_upper_bound_keeps_the_table_partition(
    active_policy, b_days, b_enabled, reason
):
    world = build_world(active_policy, b_days=b_days, b_enabled=b_enabled)

    (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds

    assert P_MARCH in getattr(kind, reason) and P_MARCH not in kind.dropped
    assert table_partition_exists(P_MARCH)
    assert not TablePartitionDrop.objects.filter(table_partition=P_MARCH).exists()
    assert TenantActivity.objects.filter(pk__in=world.march_ids()).count() == 7
    assert P_APRIL in kind.dropped  # only A has rows in April


@pytest.mark.django_db
def test_a_failure_at_the_drop_leaves_neither_the_ledger_row_nor_a_missing_table_partition(world):
    with connection.cursor() as cur:
        # Superuser in the throwaway cluster: an event trigger that fails every DROP TABLE,
        # after the ledger insert and the DETACH have run in the same transaction.
        cur.execute(
            "CREATE FUNCTION refuse_drop() RETURNS event_trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'injected failure at the drop'; END $$"
        )
        cur.execute("CREATE EVENT TRIGGER refuse_drop ON sql_drop EXECUTE FUNCTION refuse_drop()")

    with pytest.raises(DatabaseError, match="injected failure at the drop"):
        service.table_partitions_drop(slot=SLOT, now=NOW)

    assert not TablePartitionDrop.objects.exists()
    assert table_partition_exists(P_MARCH)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass(%s)", [P_MARCH])
        assert cur.fetchone()[0] == 1  # still attached
    assert TenantActivity.objects.filter(pk__in=world.march_ids()).count() == 7


@pytest.mark.django_db
def test_the_sweep_command_drops_before_admission_and_says_so(world, time_machine, capsys):
    time_machine.move_to(NOW, tick=False)
    call_command("cleanup_sweep", "--slot", "2026-08-21T02:00Z")
    out = capsys.readouterr().out
    assert "table partitions: tenant_activity:" in out and "(9 rows)" in out.split("dropped")[1]
    # The dropped rows were never candidates: the young rows are not due, so no job was admitted.
    assert "0 jobs admitted" in out


# --- The checks -----------------------------------------------------------------------

VISIT = {"model": "schema_b.Visit", "timestamp": "visited_at", "portfolio": "customer", "property": "unit__building"}
READING = {"model": "schema_b.MeterReading", "timestamp": "read_at", "portfolio": "customer", "property": "building"}
LEASE = {"model": "properties.Lease", "timestamp": "ended_at", "attachment": {"field": "document_id"}}


def e010(kind: str, entry: dict) -> list[str]:
    """Both halves of E010: the models check's and the database check's."""
    problems = check_kind(kind, entry) + table_partition_shape_problems(kind, entry)
    return [p.msg for p in problems if p.id == "retention.E010"]


@pytest.mark.django_db
def test_the_table_shape_is_read_by_the_database_check_only(settings):
    """The models checks run where no database may be read (a plain ``check``);
    the shape is said by the database check, which ``migrate`` and
    ``check --database default`` run."""
    settings.RETENTION_RECORD_KINDS = {"visit": {**VISIT, "drop_table_partitions": True}}
    assert [p.id for p in check_kind("visit", settings.RETENTION_RECORD_KINDS["visit"])] == []
    assert table_partitions_check(databases=None) == []
    (problem,) = table_partitions_check(databases=["default"])
    assert problem.id == "retention.E010" and "not partitioned" in problem.msg


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_drop_table_partitions_value_that_is_not_a_bool_is_refused_naming_the_kind_and_key(value):
    (msg,) = e010("reading", {**READING, "drop_table_partitions": value})
    assert msg.startswith("RETENTION_RECORD_KINDS['reading']['drop_table_partitions']: expected True or False")


@pytest.mark.django_db
def test_a_kind_with_an_attachment_is_refused():
    (msg,) = e010("lease", {**LEASE, "drop_table_partitions": True})
    assert "RETENTION_RECORD_KINDS['lease']['drop_table_partitions']" in msg and "attachment" in msg


@pytest.mark.django_db
def test_a_table_not_range_partitioned_on_the_timestamp_is_refused_and_one_that_is_accepted():
    (msg,) = e010("visit", {**VISIT, "drop_table_partitions": True})
    assert "RETENTION_RECORD_KINDS['visit']['drop_table_partitions']" in msg and "not partitioned" in msg
    assert e010("reading", {**READING, "drop_table_partitions": True}) == []
    assert e010("reading", {**READING, "timestamp": "read_at", "drop_table_partitions": False}) == []
    assert (
        e010(
            "activity",
            {"model": "properties.TenantActivity", "timestamp": "occurred_at", "drop_table_partitions": True},
        )
        == []
    )


# --- Concurrency: real second connections, held at the drop's checkpoints --------------

MIGRATION = importlib.import_module("properties.migrations.0006_tenant_activity_table_partitions")


@pytest.fixture
def committed(settings):  # type: ignore[no-untyped-def]
    """Committed data (the test is transactional); afterwards conftest's
    ``_table_partitions_kept`` makes the dropped table partitions again."""
    yield settings
    settings.CLEANUP_CHECKPOINTS = frozenset()


def committed_world(active_policy) -> World:  # type: ignore[no-untyped-def]
    """The world, with the empty table partitions before March 2020 gone, so the
    first table partition the drop passes its checkpoints for is March."""
    world = build_world(active_policy)
    with connection.cursor() as cur:
        for year, month in MIGRATION.month_starts(utc("2020-01-01T00:00:00Z")):
            if (year, month) < (2020, 3):
                cur.execute(f"DROP TABLE {MIGRATION.table_partition_name(year, month)}")
    return world


def drop_in_thread() -> InThread:
    return InThread(lambda: service.table_partitions_drop(slot=SLOT, now=NOW), name="drop")


def march_dropped() -> bool:
    return TablePartitionDrop.objects.filter(table_partition=P_MARCH).exists()


@pytest.mark.parametrize("checkpoint", ["table_partition.after_locks", "table_partition.before_drop"])
@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.django_db(transaction=True)
def test_a_hold_placed_while_the_drop_holds_its_locks_waits_and_covers_no_dropped_row(
    committed, active_policy, reviewer, checkpoint, scope
):
    world = committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    drop = drop_in_thread()
    try:
        hold.wait_for_worker(drop)
        placing = InThread(lambda: place(world, scope, reviewer=reviewer), name="hold")
        observer = raw_connection()
        assert placing.settle(observer) == "waiting"  # on the drop's scope locks
    finally:
        hold.release()
    drop.join()
    placing.join()
    drop.reraise()
    assert march_dropped()  # the drop decided before the hold committed
    if scope == "record":  # its record is gone with the table partition: refused, nothing placed
        assert isinstance(placing.error, ValidationError) and "record_id" in str(placing.error)
    else:
        placing.reraise()
        assert placing.result.pk is not None
    assert not TenantActivity.objects.filter(pk__in=world.march_ids()).exists()


@pytest.mark.django_db(transaction=True)
def test_a_hold_placement_that_waits_longer_than_its_bound_fails_naming_its_scope(committed, active_policy, reviewer):
    world = committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.after_locks"})
    committed.CLEANUP_SCOPE_LOCK_WAIT_SECONDS = 0.2
    hold = CheckpointHold("table_partition.after_locks")
    drop = drop_in_thread()
    try:
        hold.wait_for_worker(drop)
        placing = InThread(lambda: place(world, "portfolio", reviewer=reviewer), name="hold")
        placing.join()
    finally:
        hold.release()
    drop.join()
    assert isinstance(placing.error, ValidationError)
    assert f"table-partition drop working on portfolio {world.a.pk}" in str(placing.error)
    assert march_dropped()


@pytest.mark.django_db(transaction=True)
def test_a_drop_that_meets_a_hold_placement_holding_its_scope_is_busy_and_drops_nothing(committed, active_policy):
    world = committed_world(active_policy)
    committed.CLEANUP_TABLE_PARTITION_LOCK_SECONDS = 0.2
    placement = raw_connection(autocommit=False)
    # What legal_hold_place holds while it validates and writes: the portfolio row FOR UPDATE.
    placement.execute("SELECT id FROM properties_portfolio WHERE id = %s FOR UPDATE", [world.a.pk])
    try:
        (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds
    finally:
        placement.rollback()
        placement.close()
    assert P_MARCH in kind.busy and P_APRIL in kind.busy
    assert table_partition_exists(P_MARCH) and not march_dropped()
    assert TenantActivity.objects.filter(pk__in=world.march_ids()).count() == 7


@pytest.mark.parametrize("checkpoint", ["table_partition.after_locks", "table_partition.before_drop"])
@pytest.mark.django_db(transaction=True)
def test_an_application_insert_of_an_old_row_waits_then_lands_and_the_drop_steps_back(
    committed, active_policy, checkpoint
):
    """The insert waits on the table partition's SHARE lock. At ``after_locks``
    the drop sees it waiting before the DETACH and steps back (busy); at
    ``before_drop`` it has checked already, asks for the parent's lock, which the
    insert holds, and PostgreSQL's deadlock detector ends the drop (it waited
    last; the insert's one check, a deadlock_timeout after it began waiting,
    found no cycle because the drop was still held). Either way: busy, nothing
    written, the row lands in March."""
    world = committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    drop = drop_in_thread()
    try:
        hold.wait_for_worker(drop)
        inserting = InThread(
            lambda: TenantActivity.objects.create(
                portfolio=world.a, property=world.a1, activity_type="late", occurred_at=MARCH + timedelta(days=1)
            ),
            name="app",
        )
        assert inserting.settle(raw_connection()) == "waiting"
        time.sleep(1.5)  # past deadlock_timeout (1 s): the insert's deadlock check has run
    finally:
        hold.release()
    drop.join()
    inserting.join()
    drop.reraise()
    inserting.reraise()
    (kind,) = drop.result.kinds
    assert P_MARCH in kind.busy and not march_dropped()
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE id = %s", [inserting.result.pk])
        assert cur.fetchone()[0] == P_MARCH
    assert TenantActivity.objects.filter(pk__in=world.march_ids()).count() == 7


@pytest.mark.parametrize("checkpoint", ["table_partition.after_locks", "table_partition.before_drop"])
@pytest.mark.django_db(transaction=True)
def test_a_longer_retention_approved_while_the_drop_holds_its_locks_commits_after_it(
    committed, active_policy, manager, reviewer, checkpoint
):
    """Approving takes the portfolio row FOR UPDATE: it waits for the drop,
    which decided under the version active before it, and commits after."""
    world = committed_world(active_policy)
    rp = RetentionPolicy.objects.get(portfolio_id=world.a.pk, record_kind=KIND)
    before = rp.versions.get(status="approved").pk
    version = policy_version_submit(policy=rp, retention_days=3650, author=manager, reason="keep ten years now")
    second = make_user("second-reviewer", "compliance_reviewer")
    committed.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    drop = drop_in_thread()
    try:
        hold.wait_for_worker(drop)
        approving = InThread(
            lambda: policy_version_approve(version_id=version.pk, reviewer=second, note="ok ten years"),
            name="approve",
        )
        assert approving.settle(raw_connection()) == "waiting"
    finally:
        hold.release()
    drop.join()
    approving.join()
    drop.reraise()
    approving.reraise()
    entry = TablePartitionDrop.objects.get(table_partition=P_MARCH)
    assert entry.portfolios[str(world.a.pk)]["policy_version_id"] == before
    version.refresh_from_db()
    assert version.status == "approved"  # committed after the drop


# --- The proof of disposition ---------------------------------------------------------


@pytest.mark.django_db
def test_the_proof_lists_each_drop_and_the_verifier_recomputes_it_from_the_file_alone(world, time_machine, settings):
    from cleanup_ops.proof import proof_csv_sign, proof_sign, sweep_proof
    from cleanup_ops.proof_keys import proof_public_keys
    from cleanup_ops.proof_verify import load, verify_digests, verify_text

    from .test_proof_verify import assert_every_field_is_covered

    time_machine.move_to(NOW, tick=False)
    # The trigger bounds its session's idle time in a transaction (a stalled
    # trigger's bound); this test's whole body is one transaction, and the
    # field-by-field verification below idles it for tens of seconds on a loaded
    # machine, which that bound would end.
    settings.CLEANUP_IDLE_IN_TRANSACTION_SECONDS = 3600.0
    sweep = sweep_trigger(slot=SLOT, now=NOW).sweep
    proof = sweep_proof(sweep=sweep)
    (march,) = [d for d in proof["table_partitions"] if d["table_partition"] == P_MARCH]
    assert (march["rows"], march["ids_digest"]) == (7, digest_of(world.march_ids()))
    assert (march["lower_bound"], march["upper_bound"]) == ("2020-03-01T00:00:00Z", "2020-04-01T00:00:00Z")
    assert proof["table_partition_rows"] == 9
    keys = proof_public_keys()
    for text in (json.dumps(proof_sign(proof=proof)), proof_csv_sign(proof=proof)):
        report = verify_text(text, keys=keys)
        assert report.ok, report.problems
        assert report.table_partitions == len(proof["table_partitions"])
    # Every field of a drop (bounds, rows, each portfolio's figures) is signed: an edit to any fails.
    assert assert_every_field_is_covered(proof_sign(proof=proof), keys) > 3 * 20
    march["rows"] = 8  # a claim its portfolios do not add up to
    march["portfolios"][str(world.a.pk)]["cutoff"] = "2020-03-20T00:00:00Z"  # a cutoff before the upper bound
    problems = verify_digests(load(json.dumps(proof, default=str))).problems
    assert any(f"table partition {P_MARCH}: 8 rows stated" in p for p in problems)
    assert any(f"portfolio {world.a.pk}'s cutoff is before its upper bound" in p for p in problems)
    # A customer's scoped proof shows its own portfolio only, without the shared digest.
    scoped = sweep_proof(sweep=sweep, portfolio_ids=frozenset({world.b.pk}))
    (mine,) = [d for d in scoped["table_partitions"] if d["table_partition"] == P_MARCH]
    assert (mine["rows"], mine["ids_digest"], list(mine["portfolios"])) == (2, None, [str(world.b.pk)])


# --- The suite's own keeper (conftest.table_partitions_restore) ----------------------


@pytest.mark.django_db(transaction=True)
def test_the_suites_keeper_makes_a_dropped_table_partition_again_with_its_bounds_and_empties_its_default_rows(
    committed,
):
    made_by_the_migration = table_partitions_listed()
    portfolio = Portfolio.objects.create(name="Keeper", slug="keeper")
    prop = Property.objects.create(portfolio=portfolio, name="K1")
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE {P_APRIL}")  # committed DDL, which the flush does not undo
    stray = TenantActivity.objects.create(portfolio=portfolio, property=prop, activity_type="visit", occurred_at=APRIL)

    def home_of(pk: int) -> str:
        with connection.cursor() as cur:
            cur.execute(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE id = %s", [pk])
            return cur.fetchone()[0]

    assert home_of(stray.pk) == f"{TABLE}_default"  # with April gone, its month fell into the DEFAULT
    assert table_partitions_restore() == [P_APRIL]
    assert table_partitions_listed() == made_by_the_migration
    assert not TenantActivity.objects.filter(pk=stray.pk).exists()  # deleted, not left to block the bound
    again = TenantActivity.objects.create(portfolio=portfolio, property=prop, activity_type="visit", occurred_at=APRIL)
    assert home_of(again.pk) == P_APRIL
    assert table_partitions_restore() == []  # nothing missing: nothing made


# --- Every trigger of a slot, every actor the drop meets (issue C3-C6 of the second review) ---


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["pipeline", "portfolio a", "portfolio b"])
def test_a_pause_of_the_pipeline_or_of_a_portfolio_with_rows_in_it_keeps_the_table_partition(world, scope):
    """Pauses stop new work, and a drop is work: paused, it waits like the row deletes do."""
    from cleanup_ops.recovery.operator import pipeline_pause

    operator = make_user("operator-pausing", "operator")
    portfolio_id = {"pipeline": None, "portfolio a": world.a.pk, "portfolio b": world.b.pk}[scope]
    pipeline_pause(actor=operator, reason="investigating a wrong policy", portfolio_id=portfolio_id)
    (kind,) = service.table_partitions_drop(slot=SLOT, now=NOW).kinds
    assert P_MARCH in kind.kept_paused and table_partition_exists(P_MARCH)  # A's and B's rows
    assert TenantActivity.objects.filter(pk__in=world.march_ids()).count() == 7
    # April holds A1's rows only: a pause of B alone leaves it droppable.
    assert (P_APRIL in kind.dropped) == (scope == "portfolio b")
    assert not TablePartitionDrop.objects.filter(table_partition=P_MARCH).exists()


@pytest.mark.django_db(transaction=True)
def test_a_trigger_that_finds_its_table_partition_dropped_by_a_concurrent_trigger_ends_with_the_same_sweep(
    committed, active_policy
):
    """Both triggers listed March and April; the second takes its locks only once the
    first has dropped them: already dropped, not an error, and one sweep."""
    committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.before_lock"})
    hold = CheckpointHold("table_partition.before_lock")
    late = InThread(lambda: sweep_trigger(slot=SLOT, now=NOW), name="late trigger")
    try:
        hold.wait_for_worker(late)  # listed, held before its first lock
        committed.CLEANUP_CHECKPOINTS = frozenset()
        first = sweep_trigger(slot=SLOT, now=NOW)
    finally:
        hold.release()
    late.join()
    late.reraise()
    assert not table_partition_exists(P_MARCH) and not table_partition_exists(P_APRIL)
    (dropped,) = first.table_partitions.kinds
    (gone,) = late.result.table_partitions.kinds
    assert {P_MARCH, P_APRIL} <= set(dropped.dropped)
    assert {P_MARCH, P_APRIL} <= set(gone.already_dropped) and not gone.dropped
    assert late.result.sweep.pk == first.sweep.pk
    assert TablePartitionDrop.objects.filter(table_partition=P_MARCH).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_application_insert_arriving_just_before_the_drop_asks_for_the_parent_lands_and_the_drop_steps_back(
    committed, active_policy
):
    """The insert holds the parent's lock and waits for March's; the drop, released at
    once (inside deadlock_timeout of the insert's wait), must not queue for the parent:
    queued, it closes a cycle whose first deadlock check is the insert's."""
    world = committed_world(active_policy)
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.before_drop"})
    committed.CLEANUP_TABLE_PARTITION_LOCK_SECONDS = 2.0
    hold = CheckpointHold("table_partition.before_drop")
    drop = drop_in_thread()
    try:
        hold.wait_for_worker(drop)
        inserting = InThread(
            lambda: TenantActivity.objects.create(
                portfolio=world.a, property=world.a1, activity_type="late", occurred_at=MARCH + timedelta(days=2)
            ),
            name="app",
        )
        assert inserting.settle(raw_connection()) == "waiting"
    finally:
        hold.release()
    drop.join()
    inserting.join()
    drop.reraise()
    inserting.reraise()  # before: DeadlockDetected, the application paid for the cleanup
    (kind,) = drop.result.kinds
    assert P_MARCH in kind.busy and not march_dropped()
    assert TenantActivity.objects.filter(pk=inserting.result.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_trigger_stalled_inside_a_drop_gives_its_scope_locks_back_after_the_idle_bound(
    committed, active_policy, reviewer
):
    """The trigger's session, held at the drop's checkpoint, sits idle in its transaction
    with the scope rows locked, as a stalled (SIGSTOP) cron process would: after
    CLEANUP_IDLE_IN_TRANSACTION_SECONDS PostgreSQL ends it, and a hold placement on
    that portfolio, which waits at most CLEANUP_SCOPE_LOCK_WAIT_SECONDS, commits."""
    world = committed_world(active_policy)
    committed.CLEANUP_IDLE_IN_TRANSACTION_SECONDS = 1.0
    committed.CLEANUP_SCOPE_LOCK_WAIT_SECONDS = 6.0
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.after_locks"})
    hold = CheckpointHold("table_partition.after_locks")
    trigger = InThread(lambda: sweep_trigger(slot=SLOT, now=NOW), name="stalled trigger")
    try:
        hold.wait_for_worker(trigger)
        placed = place(world, "portfolio", reviewer=reviewer)  # before: ScopeBusy after 6 s
    finally:
        hold.release()
    trigger.join()
    assert placed.pk is not None
    assert isinstance(trigger.error, DatabaseError)  # its session was ended: nothing it did committed
    assert table_partition_exists(P_MARCH) and not march_dropped()


# --- A kind reached through its unit ----------------------------------------------------

UNIT_READING = {
    "model": "schema_b.UnitReading",
    "timestamp": "read_at",
    "portfolio": "customer",
    "property": "unit__building",
    "drop_table_partitions": True,
}
JANUARY = utc("2026-01-10T00:00:00Z")


@pytest.fixture
def unit_readings(settings):  # type: ignore[no-untyped-def]
    """The one-hop partitioned kind alone; its table partitions dropped by the
    test are made again afterwards (the keeper makes tenant activity's only)."""
    settings.RETENTION_RECORD_KINDS = {"unit_reading": UNIT_READING}
    registry_reload()
    yield
    del settings.RETENTION_RECORD_KINDS
    registry_reload()
    with connection.cursor() as cur:
        for month in range(1, 8):
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS unit_readings_2026_{month:02d} PARTITION OF unit_readings"
                f" FOR VALUES FROM ('2026-{month:02d}-01 00:00+00') TO ('2026-{month + 1:02d}-01 00:00+00')"
            )


@pytest.mark.django_db(transaction=True)
def test_a_unit_moved_into_a_held_building_while_the_drop_decides_waits_and_no_dropped_row_was_under_the_hold(
    committed, unit_readings, active_policy, reviewer
):
    """Issue 37, C1 on the drop: at ``before_drop`` (the decision made) the
    application moves a unit into another building of the same portfolio and
    a reviewer holds that building. Either the move waits for the drop (the
    drop locked the units its rows name), or, had it committed first, the
    table partition with the moved unit's rows may not be dropped."""
    from tests.schema_b.models import Unit, UnitReading

    portfolio = Portfolio.objects.create(name="Path", slug="path")
    first = Property.objects.create(portfolio=portfolio, name="First")
    second = Property.objects.create(portfolio=portfolio, name="Second")
    active_policy(portfolio, "unit_reading", 30)
    unit = Unit.objects.create(building=first)
    UnitReading.objects.bulk_create(
        [UnitReading(customer=portfolio, unit=unit, read_at=JANUARY + timedelta(minutes=i)) for i in range(3)]
    )
    committed.CLEANUP_CHECKPOINTS = frozenset({"table_partition.before_drop"})
    hold = CheckpointHold("table_partition.before_drop")
    drop = InThread(lambda: service.table_partitions_drop(slot=SLOT, now=NOW), name="drop")
    observer = raw_connection()
    try:
        hold.wait_for_worker(drop)
        move = InThread(lambda: Unit.objects.filter(pk=unit.pk).update(building=second), name="move")
        move_state = move.settle(observer)
        placing = InThread(
            lambda: legal_hold_place(
                portfolio=portfolio, property=second, placed_by=reviewer, reason="a claim on the second building"
            ),
            name="hold",
        )
        assert placing.settle(observer) == "done"
        placing.reraise()
    finally:
        hold.release()
        observer.close()
    drop.join()
    move.join()
    drop.reraise()
    move.reraise()

    january_dropped = TablePartitionDrop.objects.filter(table_partition="unit_readings_2026_01").exists()
    if move_state == "done":
        assert not january_dropped, (
            "the drop removed the readings of a unit that had moved into a building held before the drop committed"
        )
    assert move_state == "waiting"  # on the drop's lock of the unit
    assert january_dropped and not UnitReading.objects.exists()
    assert Unit.objects.get(pk=unit.pk).building_id == second.pk
