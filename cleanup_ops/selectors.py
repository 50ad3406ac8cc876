from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Sum
from django.utils import timezone

from cleanup_ops.dispatch import due_jobs
from cleanup_ops.models import CleanupJob, DeadLetter, JobState, LedgerEntry, PipelinePause, Sweep
from cleanup_ops.ratelimit import effective_limits


def pipeline_status(*, now: datetime | None = None) -> dict[str, Any]:
    """The figures ``cleanup_status`` prints: a handful of aggregate queries."""
    now = now or timezone.now()
    by_state = dict(CleanupJob.objects.values_list("state").annotate(n=Count("id")).order_by())
    oldest_due = CleanupJob.objects.filter(due_jobs(now=now)).aggregate(at=Min("available_at"))["at"]
    sweeps = list(
        Sweep.objects.order_by("-slot")[:10]
        .annotate(deleted=Sum("jobs__rows_deleted"))
        .values("id", "key", "status", "jobs_admitted", "carried_over", "deleted")
    )
    return {
        "jobs_by_state": {state: by_state.get(state, 0) for state in JobState.values},
        "oldest_due_age_seconds": round((now - oldest_due).total_seconds(), 1) if oldest_due else None,
        "leased": CleanupJob.objects.filter(state=JobState.LEASED, lease_expires_at__gt=now).count(),
        "expired_leases": CleanupJob.objects.filter(state=JobState.LEASED, lease_expires_at__lte=now).count(),
        "rows_deleted_total": LedgerEntry.objects.aggregate(n=Sum("rows_deleted"))["n"] or 0,
        "dead_letters_open": DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count(),
        "paused": [
            {"portfolio_id": p["portfolio_id"], "reason": p["reason"]}
            for p in PipelinePause.objects.filter(resumed_at__isnull=True).values("portfolio_id", "reason")
        ],
        "limits": effective_limits(),
        "ledger_rows": LedgerEntry.objects.count(),
        "sweeps": [
            {
                "sweep_id": s["id"],
                "key": s["key"],
                "status": s["status"],
                "jobs_admitted": s["jobs_admitted"],
                "carried_over": s["carried_over"],
                "rows_deleted": s["deleted"] or 0,
            }
            for s in sweeps
        ],
    }


def drain_summary() -> dict[str, Any]:
    jobs = CleanupJob.objects.values_list("state", "outcome").annotate(n=Count("id")).order_by()
    by_state: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for state, outcome, n in jobs:
        by_state[state] = by_state.get(state, 0) + n
        if outcome:
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    per_kind = {
        kind: {"deleted": deleted or 0, "held": held or 0}
        for kind, deleted, held in CleanupJob.objects.values_list("record_kind")
        .annotate(d=Sum("rows_deleted"), h=Sum("rows_held"))
        .order_by("record_kind")
    }
    return {
        "jobs_by_state": by_state,
        "jobs_by_outcome": by_outcome,
        "rows_deleted": sum(v["deleted"] for v in per_kind.values()),
        "rows_held": sum(v["held"] for v in per_kind.values()),
        "per_record_kind": per_kind,
        "ledger_rows": LedgerEntry.objects.count(),
    }
