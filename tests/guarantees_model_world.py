"""The world of the model-based test of the guarantees, and how it is run.

``tests/test_guarantees_model.py`` says what may happen (its rules); this module
holds what the rules act on and what must stay true after each of them:

- what exists, as plain Python (``Record``, ``Hold``), and ``ModelWorld``, the state
  machine's base: the estate a fresh example starts from (two portfolios of two
  properties, an approved policy per kind, the clock stopped at ``START``), the
  schema-bound methods a second schema overrides (``tests/test_guarantees_shapes.py``)
  and the promises, checked after every step (``promises_hold``);
- ``guarantees_run``, the one way both machines are run: the settings they share, the
  examples and steps of the Hypothesis profile (``HYPOTHESIS_PROFILE``, tests/testenv.py)
  and Hypothesis's options (a fixed seed, no example database).

Apart from the rules so that each file reads as one job (and stays under 600 lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import time_machine
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, run_state_machine_as_test

from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep, SweepStatus
from retention.registry import REGISTRY, get_spec
from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

from .conftest import Portfolio, Property, make_records, make_user, utc
from .testenv import examples, steps

START = utc("2026-08-21T02:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")
RETENTION_DAYS = 365
KINDS = list(REGISTRY)
WITH_FILES = ("lease", "maintenance_record")
# Ages of new records, relative to the first slot: always eligible; eligible
# from the third sweep on (slots advance a day each); never within a run.
AGES = {"old": None, "borderline": timedelta(days=RETENTION_DAYS - 2), "young": timedelta(days=30)}
CAP = 2

# Kept across examples: the tables a fresh example truncates (all but the
# migration-made roles, permissions, content types and schedules).
KEEP = {"auth_group", "auth_permission", "auth_group_permissions", "django_content_type", "django_migrations"}


@dataclass
class Record:
    kind: str
    id: Any  # the key: an integer, or a UUID
    portfolio_id: Any  # the host's keys: integers, or UUIDs (tests/settings_uuid.py)
    property_id: Any  # None: a kind without a property
    ts: object
    document_id: str | None


@dataclass(frozen=True)
class Hold:
    id: int
    portfolio_id: Any
    property_id: Any
    kind: str
    record_id: Any

    def covers(self, record: Record) -> bool:
        return (
            self.portfolio_id == record.portfolio_id
            and self.property_id in (None, record.property_id)
            and self.kind in ("", record.kind)
            and self.record_id in (None, record.id)
        )


def _truncate() -> None:
    tables = [t for t in connection.introspection.django_table_names(only_existing=True) if t not in KEEP]
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


class ModelWorld(RuleBasedStateMachine):
    """The estate, the schema-bound methods and the promises; the rules are a subclass's."""

    store = None  # the document store (set by the test)
    example = 0
    # The schema: its kinds, and those whose records name a document.
    kinds: list[str] = KINDS
    with_files: tuple[str, ...] = WITH_FILES

    def __init__(self) -> None:
        super().__init__()
        ModelWorld.example += 1
        self.prefix = f"x{ModelWorld.example}"
        _truncate()
        self.now = START + timedelta(minutes=1)
        self.clock = time_machine.travel(self.now, tick=False)
        self.coordinates = self.clock.start()
        manager = make_user("m", "property_manager")
        self.reviewer = make_user("r", "compliance_reviewer")
        self.operator = make_user("o", "operator")
        self.props: list[Property] = []
        for p in range(2):
            portfolio = Portfolio.objects.create(name=f"P{p}", slug=f"p{p}")
            for kind in self.kinds:
                policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
                version = policy_version_submit(
                    policy=policy, retention_days=RETENTION_DAYS, author=manager, reason="r for the tests"
                )
                policy_version_approve(version_id=version.pk, reviewer=self.reviewer, note="approved for the tests")
            self.props += [Property.objects.create(portfolio=portfolio, name=f"B{p}{q}") for q in range(2)]
        self.slot = START - timedelta(days=1)
        self.records: dict[tuple[str, int], Record] = {}
        self.deleted: list[Record] = []
        self.holds: list[Hold] = []
        self.batch_size = 3
        self.abandoned = None
        self.docs_seen: set[str] = set()
        self.ledger_seen = 0
        # Records the application changed during a batch, as they were before
        # the change: the batch's snapshot may have seen either state.
        self.unsettled: dict[tuple[str, int], Record] = {}
        self._estate_extra()

    # --- the schema (``tests/test_guarantees_shapes.py`` has another) -----------

    def _estate_extra(self) -> None:
        """What the schema needs beyond portfolios and properties."""

    def _make_records(self, kind: str, target: Property, count: int, ended: object) -> list[Any]:
        return make_records(target, kind, count, ended=ended)

    def _move_sql(self, record: Record, target: Property) -> tuple[str, list, dict]:
        """The application moves a record to ``target``: (SET clause, its parameters, the model's new fields)."""
        return (
            "property_id = %s, portfolio_id = %s",
            [target.pk, target.portfolio_id],
            {"property_id": target.pk, "portfolio_id": target.portfolio_id},
        )

    def _insert_old(self, app: Any, target: Property) -> Record:
        """The application inserts an old row (its transaction still open)."""
        row = app.execute(
            f"INSERT INTO {get_spec('lease').table}"
            " (portfolio_id, property_id, unit, tenant_name, started_on, ended_at)"
            " VALUES (%s, %s, '1', 'T', %s, %s) RETURNING id",
            [target.portfolio_id, target.pk, OLD.date(), OLD],
        ).fetchone()
        return Record("lease", int(row[0]), target.portfolio_id, target.pk, OLD, None)

    def _in_range(self, entry: LedgerEntry, record_id: Any) -> bool:
        """The record's key lies in the ledger row's range (a text range for a non-integer key)."""
        if entry.last_key:
            return entry.after_key < get_spec(entry.record_kind).key_text(record_id) <= entry.last_key
        return entry.after_id < record_id <= entry.last_id

    def teardown(self) -> None:
        self.clock.stop()

    # --- helpers ---------------------------------------------------------------

    def _cutoff(self) -> object:
        return self.slot - timedelta(days=RETENTION_DAYS)

    def _store_docs(self) -> set[str]:
        return {d for d in self.store.documents() if d.startswith(self.prefix + "-")}

    def _move(self, to) -> None:  # type: ignore[no-untyped-def]
        self.now = to
        self.coordinates.move_to(to, tick=False)

    def _due(self, kind: str) -> list[int]:
        return list(
            CleanupJob.objects.due(now=timezone.now()).filter(job_kind=kind).order_by("id").values_list("id", flat=True)
        )

    # --- the promises, after every step ---------------------------------------

    def _account_deletions(self) -> None:
        """Records deleted since the last look: past the cutoff, under no active hold."""
        cutoff = self._cutoff()
        alive: set[tuple[str, int]] = set()
        for kind in self.kinds:
            alive |= {(kind, i) for i in get_spec(kind).model.objects.values_list("pk", flat=True)}
        for key in [k for k in self.records if k not in alive]:
            record = self.records.pop(key)
            assert record.ts < cutoff, f"{key} deleted before its cutoff"
            held_by = [h for h in self.holds if h.covers(record)]
            assert not held_by, f"{key} deleted under hold(s) {held_by}"
            self.deleted.append(record)

    @invariant()
    def promises_hold(self) -> None:
        self._account_deletions()
        # Documents that left the store in this step.
        docs = self._store_docs()
        gone = (self.docs_seen & getattr(self, "_docs_before", self.docs_seen)) - docs
        for document_id in gone:
            named_alive = [r for r in self.records.values() if r.document_id == document_id]
            assert not named_alive, f"{document_id} purged while {named_alive[0]} names it"
            named_deleted = [r for r in self.deleted if r.document_id == document_id]
            covering = [(h, r) for r in named_deleted for h in self.holds if h.covers(r)]
            assert not covering, f"{document_id} purged while hold {covering[0][0]} covers {covering[0][1]}"
        self._docs_before = docs
        # The ledger: unique operations; held counts are rows an active hold kept.
        assert LedgerEntry.objects.count() == LedgerEntry.objects.values("operation_id").distinct().count()
        for entry in LedgerEntry.objects.filter(id__gt=self.ledger_seen).order_by("id"):
            survivors = [
                r
                for r in self.records.values()
                if r.kind == entry.record_kind
                and r.property_id == entry.property_id
                and (entry.property_id is not None or r.portfolio_id == entry.portfolio_id)
                and self._in_range(entry, r.id)
                and r.ts < entry.cutoff
            ]
            held = [r for r in survivors if any(h.covers(r) for h in self.holds)]
            # A record the application changed while this step's batch ran may
            # count either way (the batch's snapshot saw it before or after).
            # A record the application changed while the batch ran counts if a
            # hold covered it before or after the change (moved out of a held
            # scope while the DELETE waited for it, it was held in the
            # DELETE's snapshot).
            unsettled = [
                before
                for key, before in self.unsettled.items()
                if before.kind == entry.record_kind
                and self._in_range(entry, before.id)
                and any(h.covers(state) for state in (before, self.records.get(key)) if state for h in self.holds)
            ]
            strict = [r for r in held if (r.kind, r.id) not in self.unsettled]
            assert entry.rows_deleted <= entry.candidates, (entry.operation_id, entry.rows_deleted, entry.candidates)
            assert len(strict) <= entry.rows_held <= len(strict) + len(unsettled), (
                f"ledger {entry.operation_id[:12]}: rows_held {entry.rows_held},"
                f" held survivors {[r.id for r in held]}, changed meanwhile {[r.id for r in unsettled]}"
            )
            self.ledger_seen = entry.pk
        self.unsettled = {}
        # One open delete job per partition; no portfolio over its cap.
        open_by_partition: dict[tuple[int, int, str], int] = {}
        for row in CleanupJob.objects.open().deletes().values_list("portfolio_id", "property_id", "record_kind"):
            open_by_partition[row] = open_by_partition.get(row, 0) + 1
        assert all(n == 1 for n in open_by_partition.values()), open_by_partition
        holders = CleanupJob.objects.lease_holders_by_portfolio(now=timezone.now())
        assert all(n <= CAP for n in holders.values()), holders
        # A sweep is finished exactly when none of its jobs is open.
        for sweep in Sweep.objects.exclude(status=SweepStatus.ADMITTING):
            has_open = CleanupJob.objects.filter(sweep=sweep).open().exists()
            assert has_open == (sweep.status == SweepStatus.RUNNING), (sweep.key, sweep.status, has_open)


def world_settings(machine: type[ModelWorld], *, docstore: Any, settings: Any) -> None:
    """The settings and the store every run of ``machine`` has (a test driving it by hand too)."""
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = CAP
    settings.CLEANUP_BACKOFF_BASE_SECONDS = 20.0
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 0.0
    machine.store = docstore


def guarantees_run(
    machine: type[ModelWorld], *, docstore: Any, settings: Any, cost: int, step_share: float = 1.0
) -> None:
    """Run ``machine`` against ``docstore`` with ``settings`` (pytest-django's fixture):
    the profile's examples for a run that costs ``cost`` cheap examples, each of
    ``step_share`` of the profile's steps (``testenv.examples``, ``testenv.steps``)."""
    world_settings(machine, docstore=docstore, settings=settings)
    run_state_machine_as_test(
        machine,
        settings=hypothesis_settings(
            max_examples=examples(cost=cost),
            stateful_step_count=steps(share=step_share),
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
