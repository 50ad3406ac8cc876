"""Compound interleavings: a checkpoint by an actor that is itself an interleaving.

``tests/test_interleavings.py`` holds a worker at each checkpoint and runs ONE
actor. Four of issue 26's ways through need more than one thing to happen in a
given order around the held worker — a statement waiting on a row lock the
application holds while a second actor commits, a worker stalled past its
session, a worker whose clock is skewed — so the one-actor matrix cannot reach
them (the black-box versions are in ``tests/test_live_application.py``). This
module enumerates each of them over the checkpoints where it can happen:

- ``purge checkpoints x hold scope`` (case 1): while the application pins
  another scope's row, the purge's scope-lock statement waits; another worker
  deletes a second record naming the document; a reviewer places a hold on that
  record's scope while the purge is held.
- ``purge checkpoints x hold scope`` (case 2): the purge worker's session is
  killed while it is held (past its idle bound when it holds a decision), a hold
  commits, the worker resumes; the next holder of the job decides again.
- ``policy change x lease checkpoint`` (case 5): the batch's first statement
  waits on the property row the application pins, and a reviewer approves a
  stricter, withdrawn or laxer version meanwhile.
- ``checkpoints where the worker holds a lease x the skewed worker`` (case 6):
  a second worker whose real clock runs 120 s ahead (``faketime``) tries to lease
  while the held worker's lease is live, under a cap of one.

Every case ends as the one-actor suite's do: whatever is left is drained with
every lease expired, and every invariant is checked over the committed
history (``tests/interleaving.py``). Waits are observed in ``pg_locks`` and
``pg_stat_activity`` (or on the database clock), never timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, InterfaceError

from cleanup_ops import checkpoints
from cleanup_ops.clock import host_clock
from cleanup_ops.downstream.fencing import lock_bound_seconds
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import CleanupJob, JobKind, unpaused_q
from retention.services import legal_hold_place

from . import test_interleavings as one_actor
from .conftest import Lease, Portfolio, Property
from .interleaving import (
    CheckpointHold,
    Expectations,
    History,
    InThread,
    check_invariants,
    poll,
    raw_connection,
)
from .test_interleavings import CAP, NOW, OLD, SLOT, ScopeBusy, World, db_clock_now
from .test_live_application import FAKETIME, ROOT, SKEWED_WORKER, Writer, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

# The one-actor suite's fixtures: one document store for the module, its settings and history log.
store = one_actor.store
suite_settings = one_actor.suite_settings

HOLD_SCOPES = ("portfolio", "property", "kind")
MAY_RAISE = (ScopeBusy, DatabaseError, InterfaceError)


def _blockers(observer: Any, pid: int) -> list[int]:
    (blockers,) = observer.execute("SELECT pg_blocking_pids(%s)", [pid]).fetchone()
    return list(blockers or [])


def _waits_on_or_done(observer: Any, thread: InThread, holder: int) -> bool:
    return not thread.thread.is_alive() or holder in _blockers(observer, thread.pid)


def _at_checkpoint_or_done(hold: CheckpointHold, thread: InThread) -> bool:
    """The worker waits at ``hold``'s checkpoint, or finished without passing it
    (the fix closed the window the case needs: the rest of the case still runs)."""
    return bool(hold.waiters()) or not thread.thread.is_alive()


def _join(*threads: InThread, allowed: tuple[type[BaseException], ...] = MAY_RAISE) -> None:
    for thread in threads:
        thread.join()
        if thread.error is not None and not isinstance(thread.error, allowed):
            raise thread.error


def _hold_scope(scope: str, portfolio: Portfolio, prop: Property) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"portfolio": portfolio}
    if scope == "property":
        kwargs["property"] = prop
    elif scope == "kind":
        kwargs["record_kind"] = "lease"
    return kwargs


def _finish(settings: Any, store: Any, time_machine: Any, since: datetime, *, frozen: datetime | None) -> None:
    """Drain what is left, every lease expired, and check every invariant."""
    settings.CLEANUP_CHECKPOINTS = frozenset()
    boundary = db_clock_now()
    later = (frozen or boundary) + timedelta(minutes=30)
    time_machine.move_to(later, tick=False)
    cleanup_drain()
    left = CleanupJob.objects.due(now=later).filter(unpaused_q())
    assert not left.exists(), list(
        left.values("id", "job_kind", "state", "available_at", "lease_expires_at", "attempt")
    )
    deletes = [
        (r["path"].rsplit("/", 1)[1], datetime.fromtimestamp(r["at"], tz=UTC))
        for r in store.requests()
        if r["status"] == 204 and not r.get("replayed")
    ]
    expectations = Expectations(
        cap=CAP,
        pipeline_now=lambda at: (frozen or at) if at < boundary else later,
        store_deletes=deletes,
        store_documents=store.documents(),
        since=since,
    )
    check_invariants(History(), expectations).check()


# --- Case 1: a purge waits on another scope's row while a second record goes and a hold commits


def _lease(prop: Property, *, ended: datetime = OLD, document_id: str | None = None) -> int:
    return Lease.objects.create(
        portfolio_id=prop.portfolio_id,
        property=prop,
        unit="1",
        tenant_name="T",
        started_on=ended.date(),
        ended_at=ended,
        document_id=document_id,
    ).pk


@pytest.mark.parametrize("scope", HOLD_SCOPES)
@pytest.mark.parametrize("checkpoint", checkpoints.PURGE)
def test_a_purge_waiting_on_another_scope_keeps_a_file_whose_other_record_goes_and_is_held_meanwhile(
    checkpoint, scope, suite_settings, store, time_machine, active_policy, reviewer
):
    from cleanup_ops.schedule import sweep_trigger

    props = {}
    for name in ("C", "A", "B"):
        portfolio = Portfolio.objects.create(name=f"Portfolio {name}", slug=name.lower())
        active_policy(portfolio, "lease", 365)
        props[name] = Property.objects.create(portfolio=portfolio, name=f"House {name}")
        _lease(props[name], document_id="doc-x")
    store.create("doc-x")
    sweep_trigger(slot=SLOT, now=NOW)

    def job(name: str, kind: str = JobKind.DELETE) -> int:
        return CleanupJob.objects.filter(property_id=props[name].pk, job_kind=kind).order_by("-id").first().pk

    # C's lease goes and its purge keeps the file (A's and B's still name it); A's lease goes.
    job_run_slice(job_id=job("C"), owner="setup")
    job_run_slice(job_id=job("C", JobKind.PURGE), owner="setup")
    job_run_slice(job_id=job("A"), owner="setup")
    assert "doc-x" in store.documents()
    purge_a, batch_b = job("A", JobKind.PURGE), job("B")

    since = db_clock_now()
    suite_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    # The application pins C's property row (an admin edit), before the purge decides.
    pin = Writer((f"UPDATE {Property._meta.db_table} SET name = 'Renamed' WHERE id = %s", [props["C"].pk]))
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    b = props["B"]
    placing = None
    try:
        worker = InThread(lambda: job_run_slice(job_id=purge_a, owner="w1"), name="purge")
        if checkpoint == "purge.after_decision_lock":
            # Held before its scope-lock statement: B's record goes and the hold
            # is placed while it is held; let go, it then waits on the pin.
            hold.wait_for_worker(worker)
            other = InThread(lambda: job_run_slice(job_id=batch_b, owner="w2"), name="other-worker")
            other.settle(observer)
            placing = InThread(
                lambda: (
                    legal_hold_place(
                        placed_by=reviewer, reason="litigation over the file", **_hold_scope(scope, b.portfolio, b)
                    ).pk
                ),
                name="reviewer",
            )
            placing.settle(observer)
            hold.release()
            poll(lambda: _waits_on_or_done(observer, worker, pin.pid), what="the purge to wait on C's row")
            pin.commit()
        else:
            # Its scope-lock statement waits on C's row; meanwhile B's record goes.
            poll(lambda: _waits_on_or_done(observer, worker, pin.pid), what="the purge to wait on C's row")
            other = InThread(lambda: job_run_slice(job_id=batch_b, owner="w2"), name="other-worker")
            other.settle(observer)
            pin.commit()
            poll(lambda: _at_checkpoint_or_done(hold, worker), what=f"the purge at {checkpoint} or done")
            placing = InThread(
                lambda: (
                    legal_hold_place(
                        placed_by=reviewer, reason="litigation over the file", **_hold_scope(scope, b.portfolio, b)
                    ).pk
                ),
                name="reviewer",
            )
            placing.settle(observer)
    finally:
        hold.release()
        if not pin.conn.closed:
            pin.commit()
    _join(worker, other, placing, allowed=(ScopeBusy,))
    observer.close()
    _finish(suite_settings, store, time_machine, since, frozen=NOW)


# --- Case 2: a purge worker stalled past its session, a hold, the worker resumes ---------


@pytest.mark.parametrize("scope", HOLD_SCOPES)
@pytest.mark.parametrize("checkpoint", checkpoints.PURGE)
def test_a_purge_worker_whose_session_ended_while_held_deletes_no_held_file_and_the_proof_tells_the_truth(
    checkpoint, scope, suite_settings, store, time_machine
):
    # A short idle bound: a decision's session ends (or is past its fence) soon.
    suite_settings.DOCSTORE_CONNECT_TIMEOUT = 0.2
    suite_settings.DOCSTORE_READ_TIMEOUT = 0.5
    suite_settings.DOCSTORE_CLOCK_SKEW_SECONDS = 0.0
    world = World(checkpoint=checkpoint, actor="worker-session-killed", store=store)
    world.build()
    subject = world.subject()

    since = db_clock_now()
    suite_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    try:
        worker = InThread(subject, name="purge")
        pid = hold.wait_for_worker(worker)
        # Every fence the worker computed so far ends within the idle bound from now.
        (fence_end,) = observer.execute(
            "SELECT EXTRACT(EPOCH FROM clock_timestamp()) + %s", [lock_bound_seconds()]
        ).fetchone()
        observer.execute("SELECT pg_terminate_backend(%s)", [pid])
        poll(
            lambda: not observer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
            what=f"backend {pid} to end",
        )
        if checkpoint == "purge.before_store_call":
            # Stalled past its session's bound, as the backstop would have ended it.
            poll(
                lambda: observer.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp()) > %s", [fence_end]).fetchone()[
                    0
                ],
                timeout=lock_bound_seconds() + 15,
                what="the database clock to pass the decision's fence",
            )
        legal_hold_place(
            placed_by=world.reviewer, reason="a subpoena for the file", **_hold_scope(scope, world.a, world.a1)
        )
    finally:
        hold.release()
    _join(worker)
    observer.close()
    _finish(suite_settings, store, time_machine, since, frozen=NOW)


# --- Case 5: a version approved while the batch's first statement waits on a pinned row ---

POLICY_CHANGES = ("stricter", "withdrawn", "laxer")
LEASE_STARTS = ("lease.after_cap_lock", "lease_group.after_stripe_locks")


@pytest.mark.parametrize("change", POLICY_CHANGES)
@pytest.mark.parametrize("checkpoint", LEASE_STARTS)
def test_a_version_approved_while_the_batch_waits_on_a_pinned_scope_row_is_obeyed(
    checkpoint, change, suite_settings, store, time_machine
):
    world = World(checkpoint=checkpoint, actor=f"reviewer-approves-a-{change}-version", store=store)
    world.build()
    subject = world.subject()
    approve = world.act(0)

    since = db_clock_now()
    suite_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    pin = None
    try:
        worker = InThread(subject, name="worker")
        hold.wait_for_worker(worker)
        # Leased (or about to be); the application pins the property row its batch locks first.
        pin = Writer((f"UPDATE {Property._meta.db_table} SET name = 'Renamed' WHERE id = %s", [world.a1.pk]))
        hold.release()
        poll(lambda: _waits_on_or_done(observer, worker, pin.pid), what="the batch to wait on A1's row")
        reviewer = InThread(approve, name="reviewer")
        reviewer.settle(observer)
    finally:
        hold.release()
        if pin is not None and not pin.conn.closed:
            pin.commit()
    _join(worker, reviewer, allowed=(ScopeBusy, *world.actor_may_raise()))
    observer.close()
    _finish(suite_settings, store, time_machine, since, frozen=NOW)


# --- Case 6: a worker whose clock runs 120 s ahead, while the held worker's lease is live --

HOLDING_A_LEASE = checkpoints.BATCH + checkpoints.PURGE


@pytest.mark.parametrize("checkpoint", HOLDING_A_LEASE)
def test_a_worker_whose_clock_runs_120_seconds_ahead_takes_no_second_lease_while_one_is_held_at(
    checkpoint, suite_settings, store, time_machine
):
    # Real time: the skewed worker reads its own (real, skewed) clock.
    time_machine.move_to(datetime.fromtimestamp(host_clock(), tz=UTC), tick=True)
    world = World(checkpoint=checkpoint, actor="skewed-worker", store=store)
    world.build()
    if world.path == "batch":
        a1_job = world.job(world.a1).pk
    else:
        a1_job = world.job(world.a1, JobKind.PURGE).pk
        # A fresh delete job of A2 for the skewed worker to want.
        _lease(world.a2)
        from cleanup_ops.schedule import sweep_trigger

        sweep_trigger(slot=SLOT + timedelta(hours=1), now=NOW + timedelta(hours=1))
    wanted = CleanupJob.objects.filter(property_id=world.a2.pk, job_kind=JobKind.DELETE).order_by("-id").first().pk

    since = db_clock_now()
    suite_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    try:
        worker = InThread(lambda: job_run_slice(job_id=a1_job, owner="w1"), name="worker")
        hold.wait_for_worker(worker)
        skewed = subprocess.Popen(  # noqa: S603 - faketime and our own interpreter, fixed arguments
            [FAKETIME, "-f", "+120s", sys.executable, "-c", SKEWED_WORKER, str(wanted)],
            cwd=ROOT,
            env=subprocess_env(CLEANUP_PORTFOLIO_MAX_LEASES=str(CAP), PGAPPNAME="skewed-worker"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def skewed_settled() -> bool:
            if skewed.poll() is not None:
                return True
            row = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skewed-worker'"
                " AND datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
            ).fetchone()
            return bool(row[0])

        poll(skewed_settled, timeout=120, what="the skewed worker to finish or wait on a lock")
    finally:
        hold.release()
    out, err = skewed.communicate(timeout=120)
    assert skewed.returncode == 0, err
    took = json.loads(out.strip().splitlines()[-1])
    _join(worker)
    observer.close()
    in_a = set(CleanupJob.objects.filter(pk__in=took["group"], portfolio_id=world.a.pk).values_list("pk", flat=True))
    assert (sorted(in_a), took["single"]) == ([], False), f"the skewed worker took {took} beside a live lease"
    _finish(suite_settings, store, time_machine, since, frozen=None)
