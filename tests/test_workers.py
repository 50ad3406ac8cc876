"""End to end through real django-q2 workers (``manage.py qcluster``) on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from cleanup_ops.models import CleanupJob, JobState, LedgerEntry
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease
from retention.services import (
    legal_hold_place,
)

from .conftest import make_lease_estate

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


def start_cluster(**env_overrides: str) -> subprocess.Popen:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "Q_WORKERS": "2",
        "CLEANUP_BATCH_SIZE": "5",
        "CLEANUP_SLICE_BATCHES": "2",
        **env_overrides,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    proc.send_signal(signal.SIGTERM)  # the cluster's main process only
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def estate():
    props = make_lease_estate(rows=40)
    reviewer = User.objects.get(username="r")
    held = Lease.objects.filter(property=props[0]).order_by("id").values_list("id", flat=True)[:3]
    for record_id in held:
        legal_hold_place(
            portfolio=props[0].portfolio,
            record_kind="lease",
            record_id=record_id,
            placed_by=reviewer,
            reason="hold for the tests",
        )
    return props


def open_jobs() -> int:
    return CleanupJob.objects.open().count()


def test_two_qcluster_workers_drain_a_sweep_exactly_once(estate):
    proc = start_cluster()
    try:
        result = sweep_trigger()
        assert result.sweep.jobs_admitted == 6
        assert wait_for(lambda: open_jobs() == 0, timeout=90), "the cluster did not drain the sweep"
    finally:
        assert stop(proc) == 0
    assert Lease.objects.count() == 3  # only the held rows remain
    entries = list(LedgerEntry.objects.all())
    assert sum(e.rows_deleted for e in entries) == 237
    assert len({e.operation_id for e in entries}) == len(entries)
    assert set(CleanupJob.objects.values_list("outcome", flat=True)) == {"deleted"}


def test_sigterm_mid_drain_finishes_the_batch_releases_the_lease_and_a_restart_completes(estate):
    # A turn runs until its slice's seconds are spent: short ones, so the stop
    # (which lets each worker finish its turn) lands well before the drain ends.
    proc = start_cluster(CLEANUP_BATCH_SIZE="1", CLEANUP_SLICE_BATCHES="3", CLEANUP_SLICE_SECONDS="0.3")
    try:
        sweep_trigger()
        assert wait_for(lambda: LedgerEntry.objects.count() >= 5, timeout=60)
    finally:
        code = stop(proc)
    assert code == 0
    # Nothing half-applied and nothing still leased by the stopped cluster.
    assert CleanupJob.objects.filter(state=JobState.LEASED).count() == 0
    gone = 240 - Lease.objects.count()
    assert gone == sum(LedgerEntry.objects.values_list("rows_deleted", flat=True))
    assert open_jobs() > 0  # it really stopped mid-drain

    proc = start_cluster()
    try:
        from cleanup_ops.dispatch import dispatch_due_jobs

        dispatch_due_jobs()
        assert wait_for(lambda: open_jobs() == 0, timeout=90)
    finally:
        assert stop(proc) == 0
    assert Lease.objects.count() == 3
