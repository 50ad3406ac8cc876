"""The six ways through of issue 26, each as a black-box regression test.

Played as the issue's review played them, on PostgreSQL: the application
that owns the records writes on a connection of its own (moves, extends,
renames), reviewers place holds and approve versions through the services,
workers run through the services and management commands — in threads, in a
subprocess stopped with SIGSTOP, in a subprocess whose clock runs 120 s
ahead under libfaketime. A window that occurs naturally is pinned by a lock
the test holds (a row an admin edit locks, a table a maintenance job
locks), and every wait is observed in ``pg_stat_activity``/``pg_locks``,
never timed. No test here uses a product hook: they ran unchanged on the
code before the fixes (commit 7d0f663), where each failed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from cleanup_ops.execution.leases import job_lease
from cleanup_ops.execution.runner import cleanup_drain, job_run_slice
from cleanup_ops.models import CleanupJob, JobKind, JobOutcome, LedgerEntry, PurgeRequest
from cleanup_ops.schedule import sweep_trigger
from retention.models import RetentionPolicy
from retention.services import legal_hold_place, policy_version_approve, policy_version_submit

from .conftest import Lease, Portfolio, Property, utc
from .interleaving import InThread, poll, raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
FAKETIME = shutil.which("faketime") or "/usr/bin/faketime"


@pytest.fixture
def frozen(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def estate(active_policy, names: list[str], *, days: int = 365) -> dict[str, Property]:  # type: ignore[no-untyped-def]
    """One portfolio per name with one property each and a ``days`` lease policy."""
    props = {}
    for name in names:
        portfolio = Portfolio.objects.create(name=f"Portfolio {name}", slug=name.lower())
        active_policy(portfolio, "lease", days)
        props[name] = Property.objects.create(portfolio=portfolio, name=f"House {name}")
    return props


def lease_in(prop: Property, *, ended=OLD, document_id: str | None = None) -> int:  # type: ignore[no-untyped-def]
    return Lease.objects.create(
        portfolio_id=prop.portfolio_id,
        property=prop,
        unit="1",
        tenant_name="T",
        started_on=ended.date(),
        ended_at=ended,
        document_id=document_id,
    ).pk


def job_of(prop: Property, kind: str = JobKind.DELETE) -> CleanupJob:
    return CleanupJob.objects.filter(property_id=prop.pk, job_kind=kind).order_by("-id").first()


class Writer:
    """A transaction on a connection of its own, open until ``commit()``:
    the application (or an admin, or a maintenance job) mid-write."""

    def __init__(self, *statements: tuple[str, list]) -> None:
        self.conn = raw_connection(autocommit=False)
        OPEN_WRITERS.append(self)
        self.pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        for sql, params in statements:
            self.conn.execute(sql, params)

    def commit(self) -> None:
        self.conn.commit()
        self.conn.close()
        OPEN_WRITERS.remove(self)


# Writers a failed test left open: their row locks would make the next test's flush wait
# for ever, so each test ends by closing them (the server rolls their transactions back).
OPEN_WRITERS: list[Writer] = []


@pytest.fixture(autouse=True)
def _writers_let_go() -> Iterator[None]:
    yield
    while OPEN_WRITERS:
        OPEN_WRITERS.pop().conn.close()


def blocked_by(pid: int) -> list[int]:
    """Backends waiting on a lock ``pid`` holds."""
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid])
        return [int(row[0]) for row in cur.fetchall()]


def waits_on(thread: InThread, holder: int) -> bool:
    return holder in _blockers(thread.pid)


def _blockers(pid: int) -> list[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_blocking_pids(%s)", [pid])
        return list(cur.fetchone()[0] or [])


def settle(thread: InThread) -> str:
    observer = raw_connection()
    try:
        return thread.settle(observer)
    finally:
        observer.close()


def subprocess_env(**extra: str) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        **extra,
    }


# --- 1. A file purged under a hold --------------------------------------------------------


@pytest.mark.usefixtures("frozen")
def test_a_file_named_in_three_portfolios_stays_when_a_hold_on_the_last_one_commits_while_the_purge_decides(
    active_policy, reviewer, docstore
):
    props = estate(active_policy, ["C", "A", "B"])
    leases = {name: lease_in(prop, document_id="doc-x") for name, prop in props.items()}
    docstore.create("doc-x")
    sweep_trigger(slot=SLOT, now=NOW)
    # C's lease goes; its purge keeps the file (A's and B's leases still name it).
    job_run_slice(job_id=job_of(props["C"]).pk, owner="w")
    job_run_slice(job_id=job_of(props["C"], JobKind.PURGE).pk, owner="w")
    assert "doc-x" in docstore.documents()
    # An admin renames C's property (its row locked), and A's lease is deleted.
    admin = Writer(("UPDATE properties_property SET name = 'Renamed' WHERE id = %s", [props["C"].pk]))
    job_run_slice(job_id=job_of(props["A"]).pk, owner="w")
    assert not Lease.objects.filter(pk=leases["A"]).exists()
    # A maintenance job holds the maintenance table: pins the purge's last
    # check (whether any maintenance record still names the file).
    maintenance = Writer(("LOCK TABLE properties_maintenancerecord IN ACCESS EXCLUSIVE MODE", []))
    purge_a = InThread(lambda: job_run_slice(job_id=job_of(props["A"], JobKind.PURGE).pk, owner="purger"))
    poll(lambda: waits_on(purge_a, admin.pid), what="A's purge to wait on C's property row")
    # Meanwhile B's lease is deleted by its own batch (it may wait for A's purge's decision).
    batch_b = InThread(lambda: job_run_slice(job_id=job_of(props["B"]).pk, owner="w2"))
    settle(batch_b)
    admin.commit()
    settle(purge_a)
    # A portfolio-wide hold on B, covering B's lease that named the file.
    hold = InThread(
        lambda: (
            legal_hold_place(portfolio=props["B"].portfolio, placed_by=reviewer, reason="litigation over the file").pk
        )
    )
    settle(hold)
    maintenance.commit()
    for thread in (purge_a, batch_b, hold):
        thread.join()
        thread.reraise()
    cleanup_drain()
    assert "doc-x" in docstore.documents(), "the file was purged while a hold covered a lease that named it"
    assert [r for r in docstore.requests() if r["status"] == 204] == []


# --- 2. A stalled purge worker past the idle-in-transaction backstop --------------------


def test_a_purge_worker_stalled_past_its_session_deletes_no_file_under_a_hold_and_the_proof_tells_the_truth(
    active_policy, reviewer, docstore, time_machine
):
    (prop,) = estate(active_policy, ["A"]).values()
    lease = lease_in(prop, document_id="doc-stall")
    docstore.create("doc-stall")
    sweep_trigger()
    job_run_slice(job_id=job_of(prop).pk, owner="w")
    assert not Lease.objects.filter(pk=lease).exists()
    purge = job_of(prop, JobKind.PURGE)
    # The purge's last check before the store call waits on this table lock:
    # the worker is then stopped (SIGSTOP: a GC pause, a frozen VM) right
    # after deciding, and stays stopped past the session's backstop.
    maintenance = Writer(("LOCK TABLE properties_maintenancerecord IN ACCESS EXCLUSIVE MODE", []))
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "cleanup_drain", "--json"],
        cwd=ROOT,
        env=subprocess_env(
            DOCSTORE_URL=docstore.url,
            DOCSTORE_CONNECT_TIMEOUT="0.2",
            DOCSTORE_READ_TIMEOUT="0.5",
            DOCSTORE_CLOCK_SKEW_SECONDS="0",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        (backend,) = poll(lambda: blocked_by(maintenance.pid), timeout=60, what="the purge to reach its last check")
        worker.send_signal(signal.SIGSTOP)
        maintenance.commit()
        with connection.cursor() as cur:

            def gone() -> bool:
                cur.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend])
                return cur.fetchone() is None

            poll(gone, timeout=60, what="PostgreSQL to end the stalled worker's session")
        # The decision's locks are gone: a hold on the property commits.
        legal_hold_place(portfolio=prop.portfolio, property=prop, placed_by=reviewer, reason="a subpoena for the file")
        worker.send_signal(signal.SIGCONT)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
    # The next holder of the job, once the stalled worker's lease expired.
    time_machine.move_to(timezone.now() + timedelta(minutes=10), tick=False)
    job_run_slice(job_id=purge.pk, owner="next")
    cleanup_drain()
    purge.refresh_from_db()
    request = PurgeRequest.objects.get(pk=purge.purge_request_id)
    in_store = "doc-stall" in docstore.documents()
    assert in_store, "a file under a hold was deleted by a worker that resumed after its session ended"
    says_set_aside = request.documents_held > 0 or purge.outcome == JobOutcome.PURGE_HELD
    assert not says_set_aside or in_store, "the proof says set aside for a file the store no longer has"
    assert (purge.outcome, request.documents_held) == (JobOutcome.PURGE_HELD, 1)


# --- 3. A held record deleted: the application moves it while the DELETE waits ----------


@pytest.mark.usefixtures("frozen")
def test_a_lease_moved_into_a_held_property_while_the_batch_waits_on_it_is_not_deleted(
    active_policy, reviewer, docstore
):
    props = estate(active_policy, ["A"])
    a1 = props["A"]
    a2 = Property.objects.create(portfolio=a1.portfolio, name="Annex")
    moved = lease_in(a1, document_id="doc-moved")
    lease_in(a1)
    docstore.create("doc-moved")
    sweep_trigger(slot=SLOT, now=NOW)
    # The admin's raw-id field: the lease moves to the annex, not yet committed.
    app = Writer(("UPDATE properties_lease SET property_id = %s WHERE id = %s", [a2.pk, moved]))
    batch = InThread(lambda: job_run_slice(job_id=job_of(a1).pk, owner="w"))
    assert settle(batch) == "waiting" and waits_on(batch, app.pid)
    # A hold on the annex commits first, then the move.
    hold = InThread(
        lambda: legal_hold_place(
            portfolio=a1.portfolio, property=a2, placed_by=reviewer, reason="a hold on the destination"
        )
    )
    settle(hold)
    app.commit()
    for thread in (batch, hold):
        thread.join()
        thread.reraise()
    cleanup_drain()
    assert Lease.objects.filter(pk=moved, property_id=a2.pk).exists(), "a lease under a hold was deleted"
    assert "doc-moved" in docstore.documents()


# --- 4. A false "held" in the ledger: the application extends a lease -------------------


@pytest.mark.usefixtures("frozen")
def test_a_lease_extended_while_the_batch_waits_on_it_is_not_counted_as_held(active_policy):
    (prop,) = estate(active_policy, ["A"]).values()
    extended = lease_in(prop)
    lease_in(prop)
    sweep_trigger(slot=SLOT, now=NOW)
    app = Writer(("UPDATE properties_lease SET ended_at = %s WHERE id = %s", [NOW + timedelta(days=200), extended]))
    batch = InThread(lambda: job_run_slice(job_id=job_of(prop).pk, owner="w"))
    assert settle(batch) == "waiting" and waits_on(batch, app.pid)
    app.commit()
    batch.join()
    batch.reraise()
    assert Lease.objects.filter(pk=extended).exists()
    job = job_of(prop)
    (entry,) = LedgerEntry.objects.filter(job=job)
    held = getattr(entry, "rows_held", entry.candidates - entry.rows_deleted)
    assert (held, job.rows_held) == (0, 0), "a row counted as held with no hold anywhere"
    assert (job.outcome, entry.rows_deleted) == (JobOutcome.DELETED, 1)


# --- 5. A stricter policy approved while the batch waits for its scope locks -------------


@pytest.mark.usefixtures("frozen")
def test_a_stricter_version_approved_while_the_batch_waits_for_its_scope_is_obeyed(active_policy, manager, reviewer):
    (prop,) = estate(active_policy, ["A"]).values()
    recent = lease_in(prop, ended=SLOT - timedelta(days=700))  # past 365 days, within 1000
    sweep_trigger(slot=SLOT, now=NOW)
    admin = Writer(("UPDATE properties_property SET name = 'Renamed' WHERE id = %s", [prop.pk]))
    batch = InThread(lambda: job_run_slice(job_id=job_of(prop).pk, owner="w"))
    assert settle(batch) == "waiting" and waits_on(batch, admin.pid)
    policy = RetentionPolicy.objects.get(portfolio=prop.portfolio, record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=1000, author=manager, reason="keep longer")
    approval = InThread(
        lambda: policy_version_approve(version_id=version.pk, reviewer=reviewer, note="a stricter period approved").pk
    )
    approval_state = settle(approval)
    admin.commit()
    for thread in (batch, approval):
        thread.join()
    batch.reraise()
    if approval_state == "done":
        # Approved (committed) before the batch decided: the batch must obey it.
        approval.reraise()
        assert Lease.objects.filter(pk=recent).exists(), "deleted under a superseded version"
        assert not LedgerEntry.objects.filter(rows_deleted__gt=0).exists()
    else:
        # The approval waited for the in-flight batch: the batch decided under
        # the version active until then, and the approval applies after it.
        assert approval.error is None or "wait" in str(approval.error).lower(), approval.error


# --- 6. A lease cap under clock skew -------------------------------------------------------

SKEWED_WORKER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from cleanup_ops.execution.leases import job_lease, jobs_lease_group
    group = jobs_lease_group(owner="skewed", limit=5)
    single = job_lease(job_id=int(sys.argv[1]), owner="skewed")
    print(json.dumps({"group": group.job_ids if group else [], "single": single is not None}))
    """
)


def test_a_worker_whose_clock_runs_120_seconds_ahead_takes_no_second_lease_of_a_portfolio_capped_at_one(
    active_policy, settings
):
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    (a1,) = estate(active_policy, ["A"]).values()
    a2 = Property.objects.create(portfolio=a1.portfolio, name="Annex")
    lease_in(a1)
    lease_in(a2)
    sweep_trigger()
    first = job_lease(job_id=job_of(a1).pk, owner="on-time")  # live for CLEANUP_LEASE_SECONDS
    assert first is not None
    out = subprocess.run(  # noqa: S603 - faketime and our own interpreter, fixed arguments
        [FAKETIME, "-f", "+120s", sys.executable, "-c", SKEWED_WORKER, str(job_of(a2).pk)],
        cwd=ROOT,
        env=subprocess_env(CLEANUP_PORTFOLIO_MAX_LEASES="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    took = json.loads(out.stdout.strip().splitlines()[-1])
    assert took == {"group": [], "single": False}, f"the skewed worker took {took} beside a live lease"
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(DISTINCT lease_token) FROM cleanup_ops_cleanupjob"
            " WHERE portfolio_id = %s AND state = 'leased' AND lease_expires_at > clock_timestamp()",
            [a1.portfolio_id],
        )
        assert cur.fetchone()[0] == 1
    assert CleanupJob.objects.get(pk=job_of(a1).pk).lease_token == first.token


def test_the_skewed_worker_of_the_clock_test_really_runs_120_seconds_ahead():
    out = subprocess.run(  # noqa: S603 - faketime and our own interpreter, fixed arguments
        [FAKETIME, "-f", "+120s", sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert 110 < float(out.stdout) - time.time() < 130
