"""Worker clusters and their leases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min

# None: every portfolio (platform staff); a set: a customer's portfolios.
from cleanup_ops.models import (
    CleanupJob,
    JobState,
    WorkerHeartbeat,
    due_q,
    expired_lease_q,
    live_lease_q,
    liveness_verdict,
)

# --- Workers ------------------------------------------------------------------


def _owner_host(owner: str) -> str:
    # ``execution.leases.worker_name``: "<host>:<pid>".
    return owner.rsplit(":", 1)[0] if ":" in owner else owner


def workers_overview(*, now: datetime) -> dict[str, Any]:
    """Clusters (their heartbeats, judged like ``cleanup_health --liveness``),
    the leases each worker holds, and expired leases waiting to be recovered.
    Three queries. Platform staff only (it names no portfolio)."""
    stale = float(settings.CLEANUP_LIVENESS_STALE_SECONDS)
    oldest_due = CleanupJob.objects.filter(due_q(now=now)).aggregate(at=Min("available_at"))["at"]
    waited = (now - oldest_due).total_seconds() if oldest_due else None
    owners = list(
        CleanupJob.objects.filter(state=JobState.LEASED)
        .values("lease_owner")
        .annotate(
            jobs=Count("id", filter=live_lease_q(now=now)),
            holders=Count("lease_token", distinct=True, filter=live_lease_q(now=now)),
            expired=Count("id", filter=expired_lease_q(now=now)),
            expires=Max("lease_expires_at", filter=live_lease_q(now=now)),
            expired_since=Min("lease_expires_at", filter=expired_lease_q(now=now)),
            portfolios=Count("portfolio_id", distinct=True, filter=live_lease_q(now=now)),
        )
        .order_by("lease_owner")
    )
    by_host: dict[str, dict[str, int]] = {}
    for row in owners:
        row["host"] = _owner_host(row["lease_owner"])
        totals = by_host.setdefault(row["host"], {"jobs": 0, "holders": 0, "expired": 0})
        totals["jobs"] += row["jobs"]
        totals["holders"] += row["holders"]
        totals["expired"] += row["expired"]
    clusters = []
    for hb in WorkerHeartbeat.objects.order_by("host", "cluster"):
        state, quiet = liveness_verdict(waited=waited, heartbeat=hb, now=now, stale=stale)
        detail = {"idle": "no due work", "working": ""}.get(
            state, f"no progress while due work waited {int(waited or 0)} s"
        )
        clusters.append(
            {
                "hb": hb,
                "state": state,
                "detail": detail,
                "heartbeat_age_seconds": (now - hb.updated_at).total_seconds(),
                "quiet_seconds": quiet,
                "host_leases": by_host.get(hb.host, {"jobs": 0, "holders": 0, "expired": 0}),
            }
        )
    return {
        "clusters": clusters,
        "owners": owners,
        "due_waiting_seconds": waited,
        "stale_seconds": stale,
        "expired_total": sum(r["expired"] for r in owners),
    }
