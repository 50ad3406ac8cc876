"""django-q2 tasks: thin. Load by id, call a service, always return normally."""

from __future__ import annotations

import logging

from cleanup_ops.dispatch import dispatch_due_jobs
from cleanup_ops.execution.runner import stop_on_sigterm, worker_turn
from cleanup_ops.fleet import cluster_takes_work
from cleanup_ops.health import heartbeat_record_turn
from cleanup_ops.schedule import sweeps_reconcile

logger = logging.getLogger(__name__)


def run_job(job_id: int) -> dict[str, object]:
    stop_on_sigterm()
    if not cluster_takes_work():
        # Quiet or draining (an operator's decision, cleanup_ops.fleet): lease
        # nothing; the dispatcher re-sends the job after CLEANUP_LEASE_SECONDS.
        return {"job_id": job_id, "slices": 0, "rows_deleted": 0, "quiet": True}
    turn = worker_turn(job_id=job_id)
    # Wake the dispatcher so a busy pipeline refills the window now rather
    # than at the scheduler's next tick.
    dispatch_due_jobs()
    heartbeat_record_turn(jobs_leased=turn.jobs_leased, rows_deleted=turn.rows_deleted)
    return {"job_id": job_id, "slices": turn.slices, "rows_deleted": turn.rows_deleted}


def dispatch() -> int:
    try:
        # Repairs first (a stranded admission's jobs become due now), and never
        # at the cost of dispatching: a failure here is logged and retried next tick.
        sweeps_reconcile()
    except Exception as exc:
        logger.warning("sweep reconciliation failed: %s", type(exc).__name__)
    sent = dispatch_due_jobs()
    heartbeat_record_turn()
    return sent
