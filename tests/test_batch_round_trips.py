"""What the batch transaction sends (``execution.batches.batch_cursor``):
its statements prepared once per session, then only bound. Read from
libpq's own trace of the messages the worker sent."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection
from psycopg import pq

from cleanup_ops.execution.batches import PREPARE_THRESHOLD, job_load, run_batch
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property

from .conftest import make_records, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def traced() -> Iterator[list[str]]:
    """The messages this session's libpq sends (``F``) and receives (``B``)
    inside the block, one per line of its trace."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        lines: list[str] = []
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            pgconn.trace(fd)
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            yield lines
        finally:
            pgconn.untrace()
            os.close(fd)
            lines.extend(path.read_text().splitlines())


WARM_UP = 2 * PREPARE_THRESHOLD + 1


def test_the_batch_statements_are_prepared_once_per_session_and_then_only_bound(portfolio, prop, active_policy):
    """Once psycopg has prepared them (the run after 5 executions), a batch
    sends its protocol's statements as Bind of a prepared statement and
    Execute, no Parse — the parse, analysis and rewrite paid once per
    session, the plan cache free to reuse a plan; the data statement keeps
    its text and its plan for its values."""
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 30, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    job = CleanupJob.objects.get()
    lease = job_lease(job_id=job.pk, owner="prepared", now=NOW)
    assert lease is not None
    # The run after the threshold prepares; psycopg counts a statement per
    # parameter types, and a first batch's parameters (a fresh cursor) may be
    # typed otherwise than the later ones': so twice the threshold, every
    # statement's steady form is past it (a CI run parsed one in the traced batch).
    for _ in range(WARM_UP):
        assert run_batch(job=job_load(job.pk), lease=lease, limit=2, now=NOW) == (2, "")
    with traced() as lines:
        assert run_batch(job=job_load(job.pk), lease=lease, limit=2, now=NOW) == (2, "")
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    parsed = [parts[3] for parts in sent if parts[2] == "Parse"]
    bound = [parts[3].split(" ")[2] for parts in sent if parts[2] == "Bind"]
    # The fence, the policy read and the ledger write: three prepared
    # statements bound by name, none parsed; the data statement (candidates
    # and DELETE) sent as text with its values, planned for them.
    assert parsed == [], parsed
    # As text: the job's load (the ORM), BEGIN, the data statement, COMMIT
    # (a statement's text spans several lines of the trace).
    assert len([parts for parts in sent if parts[2] == "Query"]) == 4, sent
    assert "DELETE FROM" in "\n".join(lines)
    assert len([name for name in bound if name.startswith('"_pg3_')]) == 3, bound
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%FOR UPDATE%%'")
        assert len(cur.fetchall()) >= 1
    assert LedgerEntry.objects.count() == WARM_UP + 1


def test_a_finishing_batch_binds_its_sweeps_statements_prepared_too(portfolio, active_policy):
    """The last batch of a job locks its sweep and finishes it if drained, on
    the batch's cursor: those statements are prepared like the batch's."""
    active_policy(portfolio, "lease", 365)
    for n in range(PREPARE_THRESHOLD + 2):
        make_records(Property.objects.create(portfolio=portfolio, name=f"B{n}"), "lease", 3, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    jobs = list(CleanupJob.objects.order_by("id"))
    assert len(jobs) == PREPARE_THRESHOLD + 2
    for job in jobs[:-1]:
        lease = job_lease(job_id=job.pk, owner="finishing", now=NOW)
        assert lease is not None
        assert run_batch(job=job_load(job.pk), lease=lease, limit=10, now=NOW) == (3, "deleted")
    lease = job_lease(job_id=jobs[-1].pk, owner="finishing", now=NOW)
    assert lease is not None
    with traced() as lines:
        assert run_batch(job=job_load(jobs[-1].pk), lease=lease, limit=10, now=NOW) == (3, "deleted")
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    parsed = [parts[3] for parts in sent if parts[2] == "Parse"]
    bound = [parts[3].split(" ")[2] for parts in sent if parts[2] == "Bind"]
    # The protocol's three and the sweep's lock and finish bound by name; the
    # data statement sent as text.
    assert parsed == [], parsed
    # As text: the job's load (the ORM), BEGIN, the data statement, COMMIT
    # (a statement's text spans several lines of the trace).
    assert len([parts for parts in sent if parts[2] == "Query"]) == 4, sent
    assert "DELETE FROM" in "\n".join(lines)
    assert len([name for name in bound if name.startswith('"_pg3_')]) == 5, bound
    assert CleanupJob.objects.get(pk=jobs[-1].pk).state == "done"
    assert Sweep.objects.get(pk=jobs[-1].sweep_id).status == "drained"
