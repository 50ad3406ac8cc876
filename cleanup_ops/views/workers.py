"""Worker clusters, their leases and the broker's queues."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from cleanup_ops.console_selectors import workers_overview
from cleanup_ops.console_selectors.workers import queue_clusters
from cleanup_ops.dispatch import broker_status, queues
from cleanup_ops.health import clusters_judged
from cleanup_ops.views.common import render_live


@login_required
@permission_required("cleanup_ops.view_workerheartbeat", raise_exception=True)
def workers_page(request: HttpRequest) -> HttpResponse:
    """Worker clusters (heartbeats, last progress, liveness judged against the
    work of each cluster's own queue, as ``cleanup_health --liveness`` does),
    the leases each worker holds and expired leases waiting to be recovered;
    the broker's queues (messages waiting, through django-q2's broker
    interface, and how long the oldest job a cluster of the queue could take
    has waited)."""
    now = timezone.now()
    w = workers_overview(now=now)
    judged = clusters_judged(w["heartbeats"], now=now)
    empty = {"jobs": 0, "holders": 0, "expired": 0}
    for cluster in judged["clusters"]:
        cluster["host_leases"] = w["host_leases"].get(cluster["hb"].host, empty)
    context = {
        "w": w,
        "clusters": judged["clusters"],
        "broker": broker_status(),
        "waited": judged["waited_by_queue"],
        # Per queue, how to start a cluster for it: a purge cluster needs its
        # queue and the document store's address (issue 30, item 2).
        "queues": queue_clusters(now=now, queues=queues()),
    }
    return render_live(request, "console/workers.html", context)
