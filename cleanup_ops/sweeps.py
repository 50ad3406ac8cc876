"""A sweep's status: finishing a sweep the moment its last open job ends, and
the status a customer's staff see (``sweep_status_seen``).

Protocol: the sweep row is locked (``FOR UPDATE``) before its open jobs are
counted, in the transaction that ended a job. Whatever gives a sweep new work
(a redrive, a re-queued purge) updates that row in the same transaction as the
new job (``SweepQuerySet.reopen``), so either this check waits for that commit
and then sees the job, or it commits first and the reopen turns the sweep back
to running: a sweep is never left drained beside an open job, and two
transactions ending a sweep's last two jobs at once serialise on the row, so
the second sees the first's job done.

Raw SQL (two statements, here, no savepoint): the batch transaction calls this for
every partition that finishes, and through the ORM it cost about 3.6 ms a call.

The status as seen is a rule of what a sweep's status means, not of a page:
the proof, the API's and console's sweep figures and the console's sweep
history read it from here, one rule below all of them.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from psycopg import sql as pg

from cleanup_ops import sql
from cleanup_ops.lifecycle import OPEN_STATES, JobEvent, state_after
from cleanup_ops.models import DeadLetterStatus, SweepStatus
from retention.eligibility import db_datetime


@sql.statement
def _sweep_lock_running() -> pg.Composed:
    """Lock a running sweep's row (no row: not running). Parameters: ``sweep``."""
    return sql.composed(
        """
        SELECT id FROM {sweep}
        WHERE id = %(sweep)s AND status = {running}
        FOR UPDATE
        """,
        running=pg.Literal(SweepStatus.RUNNING.value),
    )


@sql.statement
def _sweep_finish_if_drained() -> pg.Composed:
    """Finish the sweep if none of its jobs is open: drained, or drained with
    dead letters when one of its jobs is dead and not redriven (a redriven
    job's work is its redrive's: once that is done, the sweep is drained).
    Run after ``_sweep_lock_running`` in the same transaction (a statement of
    its own, so its snapshot is taken once the lock is held). Parameters:
    ``sweep``, ``now``.

    The job states come from ``lifecycle.TRANSITIONS``: open is every state
    some event leaves (``lifecycle.OPEN_STATES``), dead the one *fail* leads
    to. Which sweep status follows is the sweep's own rule, stated here."""
    return sql.composed(
        """
        UPDATE {sweep} SET finished_at = %(now)s, status = CASE
            WHEN EXISTS (
                SELECT 1 FROM {job} j
                WHERE j.sweep_id = %(sweep)s AND j.state = {dead}
                    AND NOT EXISTS (SELECT 1 FROM {letter} d WHERE d.job_id = j.id AND d.status = {redriven})
            ) THEN {with_dead_letters}
            ELSE {drained} END
        WHERE id = %(sweep)s
            AND NOT EXISTS (SELECT 1 FROM {job} j WHERE j.sweep_id = %(sweep)s AND j.state IN ({open}))
        """,
        dead=pg.Literal(state_after(JobEvent.FAIL)),
        redriven=pg.Literal(DeadLetterStatus.REDRIVEN.value),
        with_dead_letters=pg.Literal(SweepStatus.DRAINED_WITH_DEAD_LETTERS.value),
        drained=pg.Literal(SweepStatus.DRAINED.value),
        open=pg.SQL(", ").join(pg.Literal(state) for state in OPEN_STATES),
    )


def sweep_mark_drained_if_finished(*, sweep_id: int, now: datetime, cur: Any = None) -> bool:
    """Mark a running sweep drained once none of its jobs is open; True if it
    was. ``cur``: the caller's cursor (the batch transaction's, whose
    statements are prepared), else a fresh one."""
    # No savepoint: inside a batch transaction a failure here fails the batch anyway.
    given = nullcontext(cur) if cur is not None else connection.cursor()
    with transaction.atomic(savepoint=False), given as used:
        if sql.execute(_sweep_lock_running(), {"sweep": sweep_id}, cur=used).fetchone() is None:
            return False
        finished = sql.execute(_sweep_finish_if_drained(), {"sweep": sweep_id, "now": db_datetime(now)}, cur=used)
        return bool(finished.rowcount == 1)


def sweep_status_seen(status: str, *, open_jobs: int, dead_jobs: int) -> str:
    """A sweep's status as a customer's staff see it: from their own jobs'
    counts (open, dead), so another customer's jobs never show through.
    ``dead_jobs``: dead jobs that were not redriven (``superseded_q``)."""
    if status == SweepStatus.ADMITTING:
        return status
    if open_jobs:
        return SweepStatus.RUNNING
    return SweepStatus.DRAINED_WITH_DEAD_LETTERS if dead_jobs else SweepStatus.DRAINED
