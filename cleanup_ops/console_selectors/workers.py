"""Worker clusters and their leases."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min

from cleanup_ops.models import (
    CleanupJob,
    ClusterControl,
    ClusterMode,
    JobState,
    LimitName,
    RuntimeLimit,
    WorkerHeartbeat,
    expired_lease_q,
    live_lease_q,
)
from cleanup_ops.ratelimit import limit_setting

# --- Workers ------------------------------------------------------------------


def _owner_host(owner: str) -> str:
    # ``execution.leases.worker_name``: "<host>:<pid>".
    return owner.rsplit(":", 1)[0] if ":" in owner else owner


def workers_overview(*, now: datetime) -> dict[str, Any]:
    """The leases each worker holds, expired leases waiting to be recovered,
    and the clusters' heartbeat rows (judged by ``health.clusters_judged``,
    the rule of ``cleanup_health --liveness``). Two queries. Platform staff
    only (it names no portfolio)."""
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
    return {
        "heartbeats": list(WorkerHeartbeat.objects.order_by("host", "cluster")),
        "host_leases": by_host,
        "owners": owners,
        "stale_seconds": float(settings.CLEANUP_LIVENESS_STALE_SECONDS),
        "expired_total": sum(r["expired"] for r in owners),
    }


def start_command(queue: str) -> str:
    """How to start a cluster serving ``queue``, as the console and the demo
    say it: the purge queue's cluster needs its queue named and the document
    store's address (a purge calls it), and a name of its own beside a delete
    cluster on the same host (the default follows the queue)."""
    if queue == settings.Q_CLUSTER["name"]:
        return "python manage.py qcluster"
    return f"Q_CLUSTER_NAME={queue} DOCSTORE_URL=<the document store> python manage.py qcluster"


def queue_clusters(*, now: datetime, queues: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Per queue (``dispatch.queues``): the job kinds it carries, how many
    clusters serving it reported within ``CLEANUP_LIVENESS_STALE_SECONDS``,
    and the command that starts one. Counts only (no host names). One query."""
    since = now - timedelta(seconds=settings.CLEANUP_LIVENESS_STALE_SECONDS)
    main = settings.Q_CLUSTER["name"]
    live: dict[str, int] = {}
    for queue in WorkerHeartbeat.objects.filter(updated_at__gte=since).values_list("queue", flat=True):
        live[queue or main] = live.get(queue or main, 0) + 1
    return [
        {"queue": queue, "kinds": kinds, "live": live.get(queue, 0), "start": start_command(queue)}
        for queue, kinds in queues.items()
    ]


def live_job_kinds(*, now: datetime, queues: dict[str, list[str]]) -> set[str]:
    """The job kinds whose queue (``queues``: queue → kinds, ``dispatch.queues``)
    has a cluster that reported within ``CLEANUP_LIVENESS_STALE_SECONDS``:
    work of any other kind waits for a worker that does not exist. One query."""
    since = now - timedelta(seconds=settings.CLEANUP_LIVENESS_STALE_SECONDS)
    main = settings.Q_CLUSTER["name"]
    fresh = WorkerHeartbeat.objects.filter(updated_at__gte=since).values_list("queue", flat=True)
    reported = {queue or main for queue in fresh}
    return {kind for queue, kinds in queues.items() if queue in reported for kind in kinds}


def cluster_controls(heartbeats: list[WorkerHeartbeat]) -> dict[tuple[str, str], ClusterControl]:
    """The operator's decisions (quiet, draining) that bind the clusters'
    current runs (the heartbeat's pid), by (host, cluster); one query."""
    if not heartbeats:
        return {}
    pids = {(hb.host, hb.cluster): hb.pid for hb in heartbeats}
    controls = ClusterControl.objects.filter(host__in={h for h, _ in pids}).select_related("set_by")
    return {
        (c.host, c.cluster): c
        for c in controls
        if pids.get((c.host, c.cluster)) == c.pid and c.mode != ClusterMode.RUNNING
    }


def limits_now() -> list[dict[str, Any]]:
    """Each run-time limit: its value now, its setting's, and the operator's
    change in force (who, when, why), if any. One query."""
    changed = {row.name: row for row in RuntimeLimit.objects.select_related("set_by")}
    return [
        {
            "name": name,
            "label": label,
            "setting": limit_setting(name),
            "value": changed[name].value if name in changed else limit_setting(name),
            "change": changed.get(name),
        }
        for name, label in LimitName.choices
    ]
