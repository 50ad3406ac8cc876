"""The interleaving matrix's fourth path: the table-partition drop, generated
over its checkpoints x every partitioned record shape x every actor.

``tests/test_interleavings_matrix.py`` generates the batch and purge paths
over shapes, stores and actors; this module is the same for the drop, which
has its own subject (the nightly trigger, ``sweep_trigger``: the command's and
the API's call, whose session carries the worker's idle bound), its own
checkpoints (``cleanup_ops.checkpoints.TABLE_PARTITION``) and shapes of its
own (a table partitioned by range on the timestamp). A new shape, actor or
checkpoint joins by adding it to a list:

- ``SHAPES``: ``schema_b``'s meter readings (a bigint key, a direct property,
  a ``DateTimeField``: the demo's tenant activity's shape, in twelve months
  rather than the demo's hundred and thirty) and unit readings (its property
  is its unit's building: the one-hop path).
- ``ACTORS``: the application inserting an old row into the month, re-timing,
  moving (a reading's unit into another building), re-homing to another
  customer and deleting a record, each also in flight where the drop waits
  for the month's lock (``IN_FLIGHT_AT``); a move followed by a hold on the
  new property (the one-hop race); holds of every scope placed and released;
  a stricter and a withdrawn policy approved; a portfolio and a global pause
  placed, a global pause lifted; another trigger of the same slot run to its
  end; a hold placed while the trigger is stalled (its session idle in its
  transaction past ``CLEANUP_IDLE_IN_TRANSACTION_SECONDS``); the trigger's
  session killed.

Each case holds the trigger at the checkpoint in the first table partition it
decides (the one with the case's old rows), lets the actor act (for the stall,
to its end), lets the trigger go, drains the row jobs the trigger admitted,
and checks every invariant over the committed history (``tests/interleaving.py``,
section 6 for the drops: no row under an active hold, every row past the
cutoff of the version active as the drop committed and named by its ledger
row, no pause it should have seen, its counts the rows that were in it), and
that a table partition is gone exactly when its ledger row exists, that the
application's writes all landed, and that every trigger ended with the one sweep
of the slot.

Kept out (``docs/architecture.md``, "The interleaving matrix"): stores (a drop
calls none: a kind with an attachment is refused by the drop's checks); a UUID
key, a kind without a property and a ``DateField`` timestamp (no partitioned
table of those shapes in the test schemas; the drop reads the key only for
its digest, ``retention.checks`` refuses a ``DateField`` partition key); a
skewed host clock (the trigger is given its slot, and reads nothing else of
the host's clock before its decision).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, InterfaceError, connection, transaction
from django.db.models import Model
from psycopg import sql as pg

from cleanup_ops import checkpoints
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, Sweep, TablePartitionDrop, unpaused_q
from cleanup_ops.recovery.operator import pipeline_pause, pipeline_resume
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import RetentionPolicy
from retention.registry import registry_reload
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)
from tests.schema_b.models import MeterReading, Unit, UnitReading

from .conftest import make_user, utc
from .interleaving import (
    CheckpointHold,
    Expectations,
    History,
    InThread,
    check_invariants,
    history_install,
    history_uninstall,
    poll,
    raw_connection,
    set_actor,
)
from .test_interleavings import CAP, IN_FLIGHT, NOW, SLOT, db_clock_now

# The test schema's partitioned tables, whose table partitions each case makes again.
pytestmark = pytest.mark.django_db(transaction=True)
MONTHS = [f"2026-{month:02d}-01 00:00+00" for month in range(1, 13)] + ["2027-01-01 00:00+00"]

YOUNG = utc("2026-07-25T00:00:00Z")  # past no cutoff of either shape: its month is kept young


# --- Shapes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A partitioned record kind: its registry entry, the month its old rows
    are in (its first table partition, so the first one the drop decides),
    its retention, and how the application writes its rows."""

    kind: str
    entry: dict[str, Any]
    model: type[Model]
    portfolio: str
    site: str | None  # the record's property field; None: through its unit
    timestamp: str
    old: datetime
    days: int
    first_table_partition: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def via_unit(self) -> bool:
        return self.site is None

    def create(self, world: World, site: Property, *, at: datetime) -> int:
        values: dict[str, Any] = {self.timestamp: at, f"{self.portfolio}_id": site.portfolio_id, **self.fields}
        if self.via_unit:
            values["unit"] = world.unit_of(site)
        else:
            values[str(self.site)] = site
        return int(self.model.objects.create(**values).pk)

    def update(self, key: int, **values: Any) -> int:
        return self.model.objects.filter(pk=key).update(**values)

    def move(self, world: World, key: int, to: Property) -> None:
        """A reading's unit moves into ``to`` (within a customer), or the
        reading to a unit of ``to`` (across customers); an activity's property
        (and customer) change."""
        owner = {f"{self.portfolio}_id": to.portfolio_id}
        record = self.model.objects.get(pk=key)
        if self.via_unit and getattr(record, f"{self.portfolio}_id") == to.portfolio_id:
            Unit.objects.filter(pk=record.unit_id).update(building=to)  # type: ignore[attr-defined]
        elif self.via_unit:
            self.update(key, unit=world.unit_of(to), **owner)
        else:
            self.update(key, **{str(self.site): to}, **owner)


METER_READING = {
    "model": "schema_b.MeterReading",
    "timestamp": "read_at",
    "portfolio": "customer",
    "property": "building",
    "drop_table_partitions": True,
}
UNIT_READING = {
    "model": "schema_b.UnitReading",
    "timestamp": "read_at",
    "portfolio": "customer",
    "property": "unit__building",
    "drop_table_partitions": True,
}

SHAPES = {
    shape.kind: shape
    for shape in (
        Shape(
            "meter_reading",
            METER_READING,
            MeterReading,
            "customer",
            "building",
            "read_at",
            old=utc("2026-01-10T00:00:00Z"),
            days=30,
            first_table_partition="meter_readings_2026_01",
        ),
        Shape(
            "unit_reading",
            UNIT_READING,
            UnitReading,
            "customer",
            None,
            "read_at",
            old=utc("2026-01-10T00:00:00Z"),
            days=30,
            first_table_partition="unit_readings_2026_01",
        ),
    )
}

# --- Actors ----------------------------------------------------------------------------

APPLICATION = (
    "application-inserts-an-old-row",
    "application-retimes-it",
    "application-moves-it-within-the-customer",
    "application-moves-it-to-another-customer",
    "application-deletes-it",
)
HOLD_SCOPES = ("portfolio", "property", "kind", "record")
ACTORS = (
    *APPLICATION,
    *(actor + IN_FLIGHT for actor in APPLICATION),
    "application-moves-it-then-a-hold-on-its-new-property-commits",
    *(f"reviewer-places-{scope}-hold" for scope in HOLD_SCOPES),
    *(f"reviewer-releases-{scope}-hold" for scope in HOLD_SCOPES),
    "reviewer-approves-a-stricter-version",
    "reviewer-approves-a-withdrawn-version",
    "operator-pauses-the-portfolio",
    "operator-pauses-the-pipeline",
    "operator-resumes-the-pipeline",
    "another-trigger",
    "reviewer-places-a-hold-while-the-trigger-stalls",
    "trigger-session-killed",
)

# A write in flight means more than the same write committed only where the
# drop next asks for the month's lock, which the write's open transaction
# conflicts with; after its locks the write waits for the drop instead (the
# committed actor's case).
IN_FLIGHT_AT = frozenset({"table_partition.before_lock"})
# The checkpoints before the drop reads pauses, policy and holds.
BEFORE_DECISION = frozenset({"table_partition.before_lock", "table_partition.after_locks"})


def meaningful(checkpoint: str, shape: Shape, actor: str) -> bool:
    if actor.endswith(IN_FLIGHT) and checkpoint not in IN_FLIGHT_AT:
        return False
    if actor == "operator-resumes-the-pipeline" and checkpoint not in BEFORE_DECISION:
        return False  # paused, the drop keeps the table partition before it reaches that checkpoint
    return True


CASES = [
    pytest.param(checkpoint, kind, actor, id=f"drop-{kind}-{checkpoint}-{actor}")
    for kind, actor in itertools.product(SHAPES, ACTORS)
    for checkpoint in checkpoints.TABLE_PARTITION
    if meaningful(checkpoint, SHAPES[kind], actor)
]

# --- The estate ------------------------------------------------------------------------

RECORDS = (  # tag, site, old
    ("R1", "a1", True),
    ("R2", "a1", True),
    ("R3", "a2", True),
    ("R4", "b1", True),
    ("Y1", "a1", False),
)


@dataclass
class World:
    checkpoint: str
    shape: Shape
    actor: str
    sites: dict[str, Property] = field(default_factory=dict)
    units: dict[int, Unit] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    pre_hold: int | None = None
    version: int | None = None
    wrote: threading.Event = field(default_factory=threading.Event)
    commit: threading.Event = field(default_factory=threading.Event)
    then: Any = None  # the one-hop race's move, on a thread of its own

    @property
    def kind(self) -> str:
        return self.shape.kind

    @property
    def in_flight(self) -> bool:
        return self.actor.endswith(IN_FLIGHT)

    @property
    def stalls(self) -> bool:
        """The trigger is held longer than its session's idle bound (a stalled process)."""
        return self.actor == "reviewer-places-a-hold-while-the-trigger-stalls"

    @property
    def finishes_while_held(self) -> bool:
        """The actor runs to its end while the trigger is held, not merely until
        it waits. Another trigger can only do so before the held one has
        written its ledger row (at ``before_drop`` it waits for that row)."""
        return self.stalls or (self.actor == "another-trigger" and self.checkpoint != "table_partition.before_drop")

    def unit_of(self, site: Property) -> Unit:
        if site.pk not in self.units:
            self.units[site.pk] = Unit.objects.create(building=site, name=f"unit of {site.name}")
        return self.units[site.pk]

    def build(self) -> None:
        self.manager = make_user("manager", "property_manager")
        self.reviewer = make_user("reviewer", "compliance_reviewer")
        self.operator = make_user("operator", "operator")
        self.a = Portfolio.objects.create(name="A", slug="a")
        self.b = Portfolio.objects.create(name="B", slug="b")
        for portfolio in (self.a, self.b):
            policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=self.kind)
            version = policy_version_submit(
                policy=policy, retention_days=self.shape.days, author=self.manager, reason="a policy of the matrix"
            )
            policy_version_approve(version_id=version.pk, reviewer=self.reviewer, note="approved for the matrix")
        self.sites = {
            "a1": Property.objects.create(portfolio=self.a, name="A1"),
            "a2": Property.objects.create(portfolio=self.a, name="A2"),
            "b1": Property.objects.create(portfolio=self.b, name="B1"),
            # No rows of its own: a drop locks the properties its rows name, not this one.
            "a3": Property.objects.create(portfolio=self.a, name="A3"),
        }
        for tag, site, old in RECORDS:
            self.records[tag] = self.shape.create(self, self.sites[site], at=self.shape.old if old else YOUNG)
        if self.actor.startswith("reviewer-releases-"):
            self._pre_hold()
        if self.actor == "operator-resumes-the-pipeline":
            pipeline_pause(actor=self.operator, reason="paused before the case", portfolio_id=None)
        if self.actor.startswith("reviewer-approves-"):
            # Submitted before: the approval (which takes the portfolio row) is the actor.
            policy = RetentionPolicy.objects.get(portfolio=self.a, record_kind=self.kind)
            stricter = self.actor.endswith("stricter-version")
            self.version = policy_version_submit(
                policy=policy,
                retention_days=self.shape.days * 20 if stricter else self.shape.days,
                enabled=stricter,
                author=self.manager,
                reason="a version reviewed during the case",
            ).pk

    def _pre_hold(self) -> None:
        """A hold on B's records, released by the actor while the trigger is held."""
        scope = self.actor.split("-")[2]
        kwargs: dict[str, Any] = {"portfolio": self.b}
        if scope == "property":
            kwargs["property"] = self.sites["b1"]
        elif scope == "kind":
            kwargs["record_kind"] = self.kind
        elif scope == "record":
            kwargs |= {"record_kind": self.kind, "record_id": str(self.records["R4"]), "property": self.sites["b1"]}
        self.pre_hold = legal_hold_place(placed_by=self.reviewer, reason="placed before the case", **kwargs).pk

    # -- the trigger and the actor --------------------------------------------------------

    def act(self, trigger_pid: int) -> Callable[[], Any]:
        name = self.actor.removesuffix(IN_FLIGHT)
        if name.startswith("reviewer-places-") and name.endswith("-hold"):
            return self._hold(name.split("-")[2])
        if name.startswith("reviewer-releases-"):
            hold, reviewer = self.pre_hold, self.reviewer
            return lambda: legal_hold_release(hold_id=hold, released_by=reviewer, reason="released during the case")
        if name == "trigger-session-killed":
            return lambda: _terminate(trigger_pid)
        return getattr(self, "_" + name.replace("-", "_"))()

    def _app(self, change: Callable[[], Any]) -> Callable[[], Any]:
        wrote, commit, in_flight = self.wrote, self.commit, self.in_flight

        def run() -> Any:
            with transaction.atomic():
                set_actor("app")
                result = change()
                wrote.set()
                if in_flight:
                    assert commit.wait(60), "never told to commit"
                return result

        return run

    def _application_inserts_an_old_row(self) -> Callable[[], Any]:
        return self._app(lambda: self.shape.create(self, self.sites["a1"], at=self.shape.old + timedelta(days=1)))

    def _application_retimes_it(self) -> Callable[[], Any]:
        r1, shape = self.records["R1"], self.shape
        return self._app(lambda: shape.update(r1, **{shape.timestamp: YOUNG}))  # into a young month

    def _application_moves_it_within_the_customer(self) -> Callable[[], Any]:
        return self._app(lambda: self.shape.move(self, self.records["R1"], self.sites["a2"]))

    def _application_moves_it_to_another_customer(self) -> Callable[[], Any]:
        return self._app(lambda: self.shape.move(self, self.records["R1"], self.sites["b1"]))

    def _application_deletes_it(self) -> Callable[[], Any]:
        r1, model = self.records["R1"], self.shape.model
        return self._app(lambda: model.objects.filter(pk=r1).delete())

    def _application_moves_it_then_a_hold_on_its_new_property_commits(self) -> Callable[[], Any]:
        """The one-hop race: R1 (a reading: its unit, with R2) moves into A3, a
        property with no rows in the month (so not one the drop locks), and
        commits, or waits for the drop; a reviewer then holds A3, and that
        commits. Whatever the drop read before, what moved is under a hold."""
        move = self._app(lambda: self.shape.move(self, self.records["R1"], self.sites["a3"]))
        reviewer, a, a2 = self.reviewer, self.a, self.sites["a3"]

        def run() -> Any:
            moving = InThread(move, name="move")
            observer = raw_connection()
            try:
                moving.settle(observer)
            finally:
                observer.close()
            self.then = moving  # joined by the case
            placed = legal_hold_place(placed_by=reviewer, reason="placed on the new site", portfolio=a, property=a2)
            return placed.pk

        return run

    def _hold(self, scope: str) -> Callable[[], Any]:
        kwargs: dict[str, Any] = {"portfolio": self.a}
        if scope == "property":
            kwargs["property"] = self.sites["a1"]
        elif scope == "kind":
            kwargs["record_kind"] = self.kind
        elif scope == "record":
            kwargs |= {"record_kind": self.kind, "record_id": str(self.records["R1"]), "property": self.sites["a1"]}
        reviewer = self.reviewer
        return lambda: legal_hold_place(placed_by=reviewer, reason="placed during the case", **kwargs).pk

    def _reviewer_places_a_hold_while_the_trigger_stalls(self) -> Callable[[], Any]:
        return self._hold("portfolio")

    def _approve(self) -> Callable[[], Any]:
        version, reviewer = self.version, self.reviewer
        return lambda: policy_version_approve(version_id=version, reviewer=reviewer, note="approved during the case").pk

    _reviewer_approves_a_stricter_version = _approve
    _reviewer_approves_a_withdrawn_version = _approve

    def _operator_pauses_the_portfolio(self) -> Callable[[], Any]:
        operator, a = self.operator, self.a.pk
        return lambda: pipeline_pause(actor=operator, reason="investigating a wrong policy", portfolio_id=a).pk

    def _operator_pauses_the_pipeline(self) -> Callable[[], Any]:
        operator = self.operator
        return lambda: pipeline_pause(actor=operator, reason="investigating a wrong policy", portfolio_id=None).pk

    def _operator_resumes_the_pipeline(self) -> Callable[[], Any]:
        operator = self.operator
        return lambda: pipeline_resume(actor=operator, reason="the policy is right after all", portfolio_id=None).pk

    def _another_trigger(self) -> Callable[[], Any]:
        return lambda: sweep_trigger(slot=SLOT, now=NOW)

    # -- what each may end with -----------------------------------------------------------

    def trigger_may_raise(self) -> tuple[type[BaseException], ...]:
        if self.actor in ("reviewer-places-a-hold-while-the-trigger-stalls", "trigger-session-killed"):
            return (DatabaseError, InterfaceError)  # its session was ended: its transaction rolled back whole
        return ()

    def actor_may_raise(self) -> tuple[type[BaseException], ...]:
        if self.actor == "reviewer-places-record-hold":
            return (ValidationError,)  # its record went with a table partition dropped before it committed
        return ()  # the application, reviewers, operators and the stalled trigger's neighbours never pay


def _terminate(pid: int) -> bool:
    """What an operator's ``pg_terminate_backend`` (or the OOM killer) does to the trigger's session."""
    killer = raw_connection()
    try:
        return bool(killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0])
    finally:
        killer.close()


def interleave_drop(
    world: World, hold: CheckpointHold, observer: Any, settings: Any
) -> tuple[InThread, InThread, datetime]:
    """Hold the trigger at the checkpoint, let the actor act (to its end where
    ``finishes_while_held``), let go; the instant it was let go, on the database's clock."""
    trigger = InThread(lambda: sweep_trigger(slot=SLOT, now=NOW), name="trigger")
    trigger_pid = hold.wait_for_worker(trigger)
    if world.actor == "another-trigger":
        settings.CLEANUP_CHECKPOINTS = frozenset()  # the held one waits already; the other passes
    acting = InThread(world.act(trigger_pid), name="actor")
    if world.finishes_while_held:
        acting.join()
    else:
        # Until it is done or waits on a lock; a write left in flight, until it has written.
        acting.settle(observer, ready=world.wrote.is_set if world.in_flight else None)
    released = db_clock_now()
    hold.release()
    if world.in_flight:

        def trigger_settled() -> bool:
            if not trigger.thread.is_alive():
                return True
            (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [trigger_pid]).fetchone()
            return bool(blockers)

        poll(trigger_settled, what="the trigger to finish or wait on the application's write")
        world.commit.set()
    trigger.join()
    acting.join()
    then = getattr(world, "then", None)
    if then is not None:
        then.join()
        then.reraise()
    return trigger, acting, released


# --- Fixtures --------------------------------------------------------------------------


def table_partitions_of(table: str) -> set[str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = CAST(%s AS regclass)",
            [table],
        )
        return {str(name) for (name,) in cur.fetchall()}


@pytest.fixture
def drop_settings(request, settings, time_machine):  # type: ignore[no-untyped-def]
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('track_commit_timestamp')")
        # A drop's instant is its commit timestamp (tests.interleaving.drop_commit_timestamps).
        assert cur.fetchone()[0] == "on", "the drop matrix needs track_commit_timestamp = on (harness.postgres)"
    shape = SHAPES[request.node.callspec.params["kind"]]
    # Unmanaged tables: the test database's flush leaves their rows, and a
    # previous case's rows (of portfolios flushed since) would keep the month
    # for want of a policy, so the trigger would be held in another month.
    with connection.cursor() as cur:
        cur.execute(pg.SQL("TRUNCATE {}").format(pg.Identifier(shape.model._meta.db_table)))
    settings.RETENTION_RECORD_KINDS = {shape.kind: shape.entry}
    registry_reload()
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = CAP
    settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS = 4.0
    settings.CLEANUP_TABLE_PARTITION_LOCK_SECONDS = 2.0
    if "stalls" in request.node.callspec.params["actor"]:
        settings.CLEANUP_IDLE_IN_TRANSACTION_SECONDS = 1.0  # below the hold placement's wait
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 0.0
    settings.CLEANUP_CHECKPOINTS = frozenset()
    time_machine.move_to(NOW, tick=False)
    history_install()
    yield settings
    history_uninstall()
    del settings.RETENTION_RECORD_KINDS
    registry_reload()
    table = shape.model._meta.db_table
    with connection.cursor() as cur:  # emptied, as schema_b's migrations 0007 and 0008 made them
        cur.execute(pg.SQL("TRUNCATE {}").format(pg.Identifier(table)))
        for start, end in itertools.pairwise(MONTHS):
            cur.execute(
                pg.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    pg.Identifier(f"{table}_{start[:7].replace('-', '_')}"),
                    pg.Identifier(table),
                    pg.Literal(start),
                    pg.Literal(end),
                )
            )


# --- The case --------------------------------------------------------------------------


def test_the_drop_matrix_has_every_checkpoint_shape_and_actor() -> None:
    assert {c.values[0] for c in CASES} == set(checkpoints.TABLE_PARTITION)
    assert {c.values[1] for c in CASES} == set(SHAPES)
    assert {c.values[2] for c in CASES} == set(ACTORS)


@pytest.mark.parametrize(("checkpoint", "kind", "actor"), CASES)
def test_a_drop_held_at_any_checkpoint_keeps_every_invariant_whatever_acts_meanwhile(
    checkpoint, kind, actor, drop_settings, time_machine
):
    shape = SHAPES[kind]
    world = World(checkpoint=checkpoint, shape=shape, actor=actor)
    world.build()
    table = shape.model._meta.db_table
    before = table_partitions_of(table)
    assert shape.first_table_partition in before

    since = db_clock_now()
    drop_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    try:
        trigger, acting, released = interleave_drop(world, hold, observer, drop_settings)
    finally:
        hold.release()
        world.commit.set()
        observer.close()
    if trigger.error is not None and not isinstance(trigger.error, world.trigger_may_raise()):
        raise trigger.error
    if acting.error is not None and not isinstance(acting.error, world.actor_may_raise()):
        raise acting.error
    # A table partition is gone exactly when its drop is on the ledger, once.
    gone = before - table_partitions_of(table)
    ledger = set(TablePartitionDrop.objects.filter(table=table).values_list("table_partition", flat=True))
    assert gone == ledger, (
        f"gone {sorted(gone - ledger)} without a ledger row; on the ledger but there {sorted(ledger - gone)}"
    )
    # Every trigger of the slot found the one sweep.
    assert Sweep.objects.filter(slot=SLOT).count() <= 1
    if actor == "another-trigger" and trigger.error is None:
        assert acting.result.sweep.pk == trigger.result.sweep.pk

    drop_settings.CLEANUP_CHECKPOINTS = frozenset()
    boundary = db_clock_now()
    later = NOW + timedelta(minutes=30)
    time_machine.move_to(later, tick=False)
    cleanup_drain()
    left = CleanupJob.objects.due(now=later).filter(unpaused_q())
    assert not left.exists(), list(left.values("id", "job_kind", "state", "available_at", "attempt"))

    expectations = Expectations(
        cap=CAP,
        pipeline_now=lambda at: NOW if at < boundary else later,
        store_deletes=[],
        store_documents=set(),
        since=since,
        drop_decided_after=released if checkpoint in BEFORE_DECISION else since,
    )
    check_invariants(History(), expectations).check()
