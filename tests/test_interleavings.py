"""Every checkpoint by every concurrent actor: hold a worker there, act, let go, check everything.

The matrix is enumerated, not picked: ``cleanup_ops.checkpoints.ALL`` (the
batch, purge, lease, redrive and pause paths) by ``ACTORS`` (the application,
a reviewer, another worker, a new sweep, an operator, the worker's session
killed): 12 checkpoints by 34 actors, 408 cases. Each case:

1. builds a small estate (portfolios A with properties A1, A2 and B with B1;
   a few leases, most long expired, some naming files in the real document
   store — one file named across properties and portfolios), the sweep, and
   whatever the actor needs to act on (a hold to release, a pause to resume,
   a dead letter);
2. enables the one checkpoint (``settings.CLEANUP_CHECKPOINTS``), takes its
   advisory lock on a connection of its own, starts the worker on a thread
   (its own connection) and waits until ``pg_locks`` shows the worker
   waiting there;
3. runs the actor on its own connection and thread, until it has finished or
   is seen waiting on a lock the held worker has (a reviewer may wait for an
   in-flight batch, then commit or fail after
   ``CLEANUP_SCOPE_LOCK_WAIT_SECONDS`` with ``ScopeBusy``: both are correct).
   Each application write also runs *in flight*: its transaction stays open
   (its row locked) while the worker resumes, and commits once the worker has
   finished or is seen waiting on that row — the window in which PostgreSQL
   re-checks a changed row against a waiting statement's predicate;
4. lets the worker go, joins both, then drains what is left (time moved past
   every lease) so each case ends with nothing due;
5. checks every invariant over the committed history (``tests/interleaving.py``:
   the commit order of every row change, logged by deferred triggers, and
   the store's own log of file deletions):
   no row deleted that an active hold covered when its delete committed, or
   that was younger than the stricter of the admitted and the then active
   version's cutoffs (a withdrawn policy deletes nothing); every ledger row's
   held count is the rows of its range an active hold covered, deleted ≤
   candidates, no operation id twice; never more live lease holders per
   portfolio than the cap, no lease taken under a pause, at most one open
   delete job per partition, at every commit; no file deleted from the store
   while a surviving record named it or an active hold covered a record
   (deleted or alive) that named it; a request's set-aside documents are
   files the store still has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, InterfaceError, transaction

from cleanup_ops import checkpoints
from cleanup_ops.console_selectors.jobs import JobFilter
from cleanup_ops.execution.runner import cleanup_drain, group_run_slice, job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, unpaused_q
from cleanup_ops.recovery.classification import InvalidInput
from cleanup_ops.recovery.operator import (
    DeadLetterNotOpen,
    JobAction,
    PartitionBusy,
    dead_letter_dismiss,
    dead_letter_redrive,
    jobs_act,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.schedule import sweep_trigger
from retention import services
from retention.models import RetentionPolicy
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import DocstoreProcess, Lease, Portfolio, Property, make_user, utc
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

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T04:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")
YOUNG = SLOT - timedelta(days=30)
DAYS = 365
CAP = 1
REASON = "interleaving suite decision"
FILES = ("d-shared", "d-own", "d-young", "d-new", "d-b")

# A reviewer's answer to a scope its worker holds: it waited and committed,
# or it gave up after CLEANUP_SCOPE_LOCK_WAIT_SECONDS naming what it waited for.
ScopeBusy = getattr(services, "ScopeBusy", ValidationError)


def _path(checkpoint: str) -> str:
    return checkpoint.split(".", 1)[0]


# --- The estate ---------------------------------------------------------------------------


@dataclass
class World:
    """One case's estate, and what its actors act on."""

    checkpoint: str
    actor: str
    store: DocstoreProcess
    manager: Any = None
    reviewer: Any = None
    a: Portfolio | None = None
    b: Portfolio | None = None
    a1: Property | None = None
    a2: Property | None = None
    b1: Property | None = None
    leases: dict[str, int] | None = None
    pre_hold: int | None = None
    letter: int | None = None
    wrote: threading.Event = field(default_factory=threading.Event)
    commit: threading.Event = field(default_factory=threading.Event)
    threads: tuple[Any, Any] = (None, None)

    @property
    def path(self) -> str:
        return _path(self.checkpoint)

    def job(self, prop: Property, kind: str = JobKind.DELETE) -> CleanupJob | None:
        return CleanupJob.objects.filter(property_id=prop.pk, job_kind=kind).order_by("-id").first()

    def build(self) -> None:
        self.manager = make_user("manager", "property_manager")
        self.reviewer = make_user("reviewer", "compliance_reviewer")
        self.a = Portfolio.objects.create(name="A", slug="a")
        self.b = Portfolio.objects.create(name="B", slug="b")
        for portfolio in (self.a, self.b):
            policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
            version = policy_version_submit(
                policy=policy, retention_days=DAYS, author=self.manager, reason="a policy of the suite"
            )
            policy_version_approve(version_id=version.pk, reviewer=self.reviewer, note="approved for the suite")
        self.a1 = Property.objects.create(portfolio=self.a, name="A1")
        self.a2 = Property.objects.create(portfolio=self.a, name="A2")
        self.b1 = Property.objects.create(portfolio=self.b, name="B1")
        self.leases = {}
        for name, prop, ended, doc in (
            ("L1", self.a1, OLD, "d-shared"),
            ("L2", self.a1, OLD, "d-own"),
            ("Y1", self.a1, YOUNG, "d-young"),
            ("L3", self.a2, OLD, "d-shared"),
            ("L4", self.b1, OLD, "d-shared"),
            ("L5", self.b1, OLD, "d-b"),
        ):
            lease = Lease.objects.create(
                portfolio_id=prop.portfolio_id,
                property=prop,
                unit="1",
                tenant_name="T",
                started_on=ended.date(),
                ended_at=ended,
                document_id=doc,
            )
            self.leases[name] = lease.pk
        self.store.create(*FILES)
        if self.actor == "reviewer-releases-record-hold":
            self._pre_hold()  # a record hold names a record that exists: before the batch
        sweep_trigger(slot=SLOT, now=NOW)
        if self.path == "redrive":
            self.letter = self._dead(self.a1)
        elif self.actor in ("operator-redrives", "operator-dismisses"):
            self.letter = self._dead(self.a2)
        if self.path == "purge":
            while group_run_slice(owner="setup").leased:
                pass
        if self.actor.startswith("reviewer-releases") and self.pre_hold is None:
            self._pre_hold()
        if self.actor == "operator-resumes":
            pipeline_pause(actor=None, reason=REASON, portfolio_id=self.b.pk)

    def _dead(self, prop: Property) -> int:
        def fail(job_id: int) -> None:
            raise InvalidInput("bad input")

        job_run_slice(job_id=self.job(prop).pk, owner="setup", before_batch=fail)
        return DeadLetter.objects.get(job=self.job(prop)).pk

    def _pre_hold(self) -> None:
        scope = self.actor.rsplit("-", 2)[-2]
        kwargs: dict[str, Any] = {"portfolio": self.b}
        if scope == "property":
            kwargs["property"] = self.b1
        elif scope == "kind":
            kwargs["record_kind"] = "lease"
        elif scope == "record":
            kwargs |= {"property": self.b1, "record_kind": "lease", "record_id": self.leases["L4"]}
        self.pre_hold = legal_hold_place(placed_by=self.reviewer, reason="placed before the case", **kwargs).pk

    # -- the worker held at the checkpoint ----------------------------------------------

    def subject(self) -> Callable[[], Any]:
        if self.path == "batch" or self.checkpoint == "lease_group.after_stripe_locks":
            return lambda: group_run_slice(owner="w1", max_jobs=2)
        if self.path == "lease":
            job_id = self.job(self.a1).pk
            return lambda: job_run_slice(job_id=job_id, owner="w1")
        if self.path == "purge":
            job = self.job(self.a1, JobKind.PURGE)
            assert job is not None, "setup: A1's batch wrote no purge request"
            return lambda: job_run_slice(job_id=job.pk, owner="w1")
        if self.path == "redrive":
            letter = self.letter
            return lambda: dead_letter_redrive(letter_id=letter, actor=None, reason=REASON)
        if self.path == "pause":
            portfolio_id = self.a.pk
            return lambda: pipeline_pause(actor=None, reason=REASON, portfolio_id=portfolio_id)
        raise AssertionError(f"no subject for {self.checkpoint}")

    def subject_may_raise(self) -> tuple[type[BaseException], ...]:
        if self.actor.startswith("worker-session-killed"):
            return (DatabaseError, InterfaceError)
        if self.path == "redrive":
            return (PartitionBusy, DeadLetterNotOpen)
        if self.path == "pause":
            return (ValidationError,)
        return ()

    # -- the actor ------------------------------------------------------------------------

    def target(self) -> int:
        """The record the application and a record hold act on: the first
        expired lease of A1 where a batch is still to run, the surviving young
        one where its batch already ran (the purge path)."""
        return self.leases["Y1" if self.path == "purge" else "L1"]

    @property
    def in_flight(self) -> bool:
        return self.actor.endswith(IN_FLIGHT)

    def act(self, worker_pid: int) -> Callable[[], Any]:
        name = self.actor.removesuffix(IN_FLIGHT)
        return getattr(self, "_" + name.replace("-", "_"))(worker_pid)

    def _app(self, change: Callable[[], Any]) -> Callable[[], Any]:
        """The application's write in its own transaction; in flight, the
        transaction stays open (its row locks held) until the worker, let go,
        has finished or waits on it."""
        wrote, commit = self.wrote, self.commit

        def run() -> Any:
            with transaction.atomic():
                set_actor("app")
                result = change()
                wrote.set()
                if self.in_flight:
                    assert commit.wait(60), "never told to commit"
                return result

        return run

    def _application_inserts_an_old_row(self, pid: int) -> Callable[[], Any]:
        a1 = self.a1
        return self._app(
            lambda: (
                Lease.objects.create(
                    portfolio_id=a1.portfolio_id,
                    property=a1,
                    unit="9",
                    tenant_name="N",
                    started_on=OLD.date(),
                    ended_at=OLD,
                    document_id="d-shared",
                ).pk
            )
        )

    def _application_extends_a_lease(self, pid: int) -> Callable[[], Any]:
        target = self.target()
        return self._app(lambda: Lease.objects.filter(pk=target).update(ended_at=NOW + timedelta(days=400)))

    def _application_moves_it_within_the_portfolio(self, pid: int) -> Callable[[], Any]:
        target, to = self.target(), self.a2
        return self._app(lambda: Lease.objects.filter(pk=target).update(property=to))

    def _application_moves_it_to_another_portfolio(self, pid: int) -> Callable[[], Any]:
        target, to = self.target(), self.b1
        return self._app(lambda: Lease.objects.filter(pk=target).update(property=to, portfolio_id=to.portfolio_id))

    def _application_edits_its_document_id(self, pid: int) -> Callable[[], Any]:
        target = self.target()
        doc = "d-new" if self.path != "purge" else "d-shared"
        return self._app(lambda: Lease.objects.filter(pk=target).update(document_id=doc))

    def _application_deletes_it(self, pid: int) -> Callable[[], Any]:
        target = self.target()
        return self._app(lambda: Lease.objects.filter(pk=target).delete())

    def _hold(self, **scope: Any) -> Callable[[], Any]:
        reviewer = self.reviewer
        return lambda: legal_hold_place(placed_by=reviewer, reason="placed during the case", **scope).pk

    def _reviewer_places_portfolio_hold(self, pid: int) -> Callable[[], Any]:
        return self._hold(portfolio=self.a)

    def _reviewer_places_property_hold(self, pid: int) -> Callable[[], Any]:
        return self._hold(portfolio=self.a, property=self.a1)

    def _reviewer_places_kind_hold(self, pid: int) -> Callable[[], Any]:
        return self._hold(portfolio=self.a, record_kind="lease")

    def _reviewer_places_record_hold(self, pid: int) -> Callable[[], Any]:
        return self._hold(portfolio=self.a, property=self.a1, record_kind="lease", record_id=self.target())

    def _release(self, pid: int) -> Callable[[], Any]:
        hold, reviewer = self.pre_hold, self.reviewer
        return lambda: legal_hold_release(hold_id=hold, released_by=reviewer, reason="released during the case").pk

    _reviewer_releases_portfolio_hold = _release
    _reviewer_releases_property_hold = _release
    _reviewer_releases_kind_hold = _release
    _reviewer_releases_record_hold = _release

    def _version(self, *, days: int = DAYS, enabled: bool = True, batch_size: int | None = None) -> Callable[[], Any]:
        policy = RetentionPolicy.objects.get(portfolio=self.a, record_kind="lease")
        manager, reviewer = self.manager, self.reviewer

        def run() -> Any:
            version = policy_version_submit(
                policy=policy,
                retention_days=days,
                enabled=enabled,
                batch_size=batch_size,
                author=manager,
                reason="a policy of the suite",
            )
            return policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved during the case").pk

        return run

    def _reviewer_approves_a_stricter_version(self, pid: int) -> Callable[[], Any]:
        return self._version(days=4000)  # OLD is then within retention: nothing of A may go

    def _reviewer_approves_a_laxer_version(self, pid: int) -> Callable[[], Any]:
        return self._version(days=7)  # the young lease is past it, but not past the admitted cutoff

    def _reviewer_approves_a_withdrawn_version(self, pid: int) -> Callable[[], Any]:
        return self._version(enabled=False)

    def _reviewer_changes_the_batch_size(self, pid: int) -> Callable[[], Any]:
        return self._version(batch_size=1)

    def _another_worker(self, pid: int) -> Callable[[], Any]:
        if self.path == "purge":
            other = self.job(self.a2, JobKind.PURGE) or self.job(self.b1, JobKind.PURGE)
            assert other is not None
            return lambda: job_run_slice(job_id=other.pk, owner="w2")
        return lambda: group_run_slice(owner="w2", max_jobs=3).leased

    def _a_new_sweep(self, pid: int) -> Callable[[], Any]:
        return lambda: sweep_trigger(slot=SLOT + timedelta(hours=1), now=NOW).sweep.jobs_admitted

    def _operator_pauses(self, pid: int) -> Callable[[], Any]:
        portfolio_id = self.a.pk
        return lambda: pipeline_pause(actor=None, reason=REASON, portfolio_id=portfolio_id).pk

    def _operator_resumes(self, pid: int) -> Callable[[], Any]:
        portfolio_id = self.b.pk
        return lambda: pipeline_resume(actor=None, reason=REASON, portfolio_id=portfolio_id).pk

    def _operator_redrives(self, pid: int) -> Callable[[], Any]:
        letter = self.letter
        return lambda: dead_letter_redrive(letter_id=letter, actor=None, reason=REASON).pk

    def _operator_dismisses(self, pid: int) -> Callable[[], Any]:
        letter = self.letter
        return lambda: dead_letter_dismiss(letter_id=letter, actor=None, reason=REASON).pk

    def _job_for_actions(self) -> int:
        if self.path == "purge":
            return self.job(self.a1, JobKind.PURGE).pk
        return self.job(self.a2 if self.path == "redrive" else self.a1).pk

    def _operator_cancels(self, pid: int) -> Callable[[], Any]:
        job_id = self._job_for_actions()
        return lambda: (
            jobs_act(action=JobAction.CANCEL, actor=None, reason=REASON, job_filter=JobFilter(job_ids=(job_id,))).jobs
        )

    def _operator_runs_now(self, pid: int) -> Callable[[], Any]:
        job_id = self._job_for_actions()
        return lambda: (
            jobs_act(action=JobAction.RUN_NOW, actor=None, reason=REASON, job_filter=JobFilter(job_ids=(job_id,))).jobs
        )

    def _worker_session_killed(self, pid: int) -> Callable[[], Any]:
        def kill() -> Any:
            observer = raw_connection()
            try:
                observer.execute("SELECT pg_terminate_backend(%s)", [pid])
                poll(
                    lambda: not observer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
                    what=f"backend {pid} to end",
                )
            finally:
                observer.close()
            return pid

        return kill

    def _worker_session_killed_then_a_hold_commits(self, pid: int) -> Callable[[], Any]:
        """The stalled worker's session ends (an operator's pg_terminate_backend,
        a failover, a dropped connection: not only the idle-in-transaction
        backstop), its locks go with it, and a portfolio-wide hold commits
        before the worker resumes."""
        kill, place = self._worker_session_killed(pid), self._hold(portfolio=self.a)

        def run() -> Any:
            kill()
            return place()

        return run

    def actor_may_raise(self) -> tuple[type[BaseException], ...]:
        # Waited for the held worker and gave up after the bounded wait; a
        # decision that another one made first (a letter decided, a partition
        # taken, a pause already there); a record hold on a record already gone.
        return (ScopeBusy, ValidationError, PartitionBusy, DeadLetterNotOpen)


# The application's write left uncommitted while the worker resumes (it
# commits once the worker has finished or waits on its row): the window
# in which a statement re-checks a row that changed under it.
IN_FLIGHT = "-in-flight"
APPLICATION = (
    "application-inserts-an-old-row",
    "application-extends-a-lease",
    "application-moves-it-within-the-portfolio",
    "application-moves-it-to-another-portfolio",
    "application-edits-its-document-id",
    "application-deletes-it",
)
ACTORS = (
    *APPLICATION,
    *(actor + IN_FLIGHT for actor in APPLICATION),
    "reviewer-places-portfolio-hold",
    "reviewer-places-property-hold",
    "reviewer-places-kind-hold",
    "reviewer-places-record-hold",
    "reviewer-releases-portfolio-hold",
    "reviewer-releases-property-hold",
    "reviewer-releases-kind-hold",
    "reviewer-releases-record-hold",
    "reviewer-approves-a-stricter-version",
    "reviewer-approves-a-laxer-version",
    "reviewer-approves-a-withdrawn-version",
    "reviewer-changes-the-batch-size",
    "another-worker",
    "a-new-sweep",
    "operator-pauses",
    "operator-resumes",
    "operator-redrives",
    "operator-dismisses",
    "operator-cancels",
    "operator-runs-now",
    "worker-session-killed",
    "worker-session-killed-then-a-hold-commits",
)


# The cases whose worker holds its scope rows (``FOR SHARE``: a batch's fence and scope
# statement, a purge's scope lock) while an actor changes what those rows guard: a hold
# placed on every scope (its ``FOR UPDATE`` of the same rows waits), a hold committed
# while the worker's session is gone, a record moved to another property or portfolio.
# tests/test_uuid_schema.py runs them on the UUID schema too (scope rows keyed by UUIDs).
SCOPE_LOCK_CHECKPOINTS = (*checkpoints.BATCH, *checkpoints.PURGE[1:])
SCOPE_LOCK_ACTORS = (
    "reviewer-places-portfolio-hold",
    "reviewer-places-property-hold",
    "reviewer-places-kind-hold",
    "reviewer-places-record-hold",
    "worker-session-killed-then-a-hold-commits",
    "application-moves-it-within-the-portfolio" + IN_FLIGHT,
    "application-moves-it-to-another-portfolio" + IN_FLIGHT,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One document store for the module, emptied before each case."""
    process = DocstoreProcess(str(tmp_path_factory.mktemp("interleavings") / "docstore.sqlite3"))
    yield process
    process.stop()


@pytest.fixture
def suite_settings(settings, store, time_machine):  # type: ignore[no-untyped-def]
    store._admin("POST", "reset")
    settings.DOCSTORE_URL = store.url
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = CAP
    settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS = 1.0
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 0.0
    settings.CLEANUP_CHECKPOINTS = frozenset()
    time_machine.move_to(NOW, tick=False)
    history_install()
    yield settings
    history_uninstall()


def db_clock_now() -> datetime:
    """The database server's clock on a connection of its own (the compound cases read it too)."""
    observer = raw_connection()
    try:
        return observer.execute("SELECT clock_timestamp()").fetchone()[0]
    finally:
        observer.close()


def interleave(world: World, subject: Callable[[], Any], hold: CheckpointHold, observer: Any) -> None:
    """Hold the worker at the checkpoint, let the actor act, let go (see the module docstring)."""
    worker = InThread(subject, name="worker")
    world.threads = (worker, None)
    worker_pid = hold.wait_for_worker(worker)
    acting = InThread(world.act(worker_pid), name="actor")
    world.threads = (worker, acting)
    acting.settle(observer, ready=world.wrote.is_set)
    hold.release()
    if world.in_flight:
        # The worker goes on while the write is in flight: until it has
        # finished or waits on the application's row, then the write commits.
        def worker_settled() -> bool:
            if not worker.thread.is_alive():
                return True
            (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [worker_pid]).fetchone()
            return bool(blockers)

        poll(worker_settled, what="the worker to finish or wait on the application's row")
        world.commit.set()
    worker.join()
    acting.join()


def scope_lock_cases() -> list[str]:
    """The node ids of the scope-lock cases (``SCOPE_LOCK_CHECKPOINTS`` x ``SCOPE_LOCK_ACTORS``)."""
    test = test_a_worker_held_at_any_checkpoint_keeps_every_invariant_whatever_acts_meanwhile.__name__
    return [
        f"tests/test_interleavings.py::{test}[{checkpoint}-{actor}]"
        for checkpoint in SCOPE_LOCK_CHECKPOINTS
        for actor in SCOPE_LOCK_ACTORS
    ]


@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("checkpoint", checkpoints.ALL)
def test_a_worker_held_at_any_checkpoint_keeps_every_invariant_whatever_acts_meanwhile(
    checkpoint, actor, suite_settings, store, time_machine
):
    world = World(checkpoint=checkpoint, actor=actor, store=store)
    world.build()
    subject = world.subject()

    since = db_clock_now()
    suite_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    try:
        interleave(world, subject, hold, observer)
    finally:
        hold.release()
        world.commit.set()
        observer.close()
    worker, acting = world.threads
    if worker.error is not None and not isinstance(worker.error, world.subject_may_raise()):
        raise worker.error
    if acting.error is not None and not isinstance(acting.error, world.actor_may_raise()):
        raise acting.error

    # Whatever is left runs to the end, every lease expired.
    suite_settings.CLEANUP_CHECKPOINTS = frozenset()
    boundary = db_clock_now()
    later = NOW + timedelta(minutes=30)
    time_machine.move_to(later, tick=False)
    cleanup_drain()
    left = CleanupJob.objects.due(now=later).filter(unpaused_q())
    assert not left.exists(), list(
        left.values("id", "job_kind", "state", "available_at", "lease_expires_at", "attempt")
    )

    history = History()
    deletes = [
        (r["path"].rsplit("/", 1)[1], datetime.fromtimestamp(r["at"], tz=UTC))
        for r in store.requests()
        if r["status"] == 204 and not r.get("replayed")
    ]
    expectations = Expectations(
        cap=CAP,
        pipeline_now=lambda at: NOW if at < boundary else later,
        store_deletes=deletes,
        store_documents=store.documents(),
        since=since,
    )
    check_invariants(history, expectations).check()
