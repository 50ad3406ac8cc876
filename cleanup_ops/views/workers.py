"""Worker clusters, their leases and the broker's queues."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_POST

from cleanup_ops.console_selectors import workers_overview
from cleanup_ops.console_selectors.workers import cluster_controls, limits_now, queue_clusters
from cleanup_ops.dispatch import broker_status, queues
from cleanup_ops.fleet import CLUSTER_CONTROL_PERMISSION, ClusterDecision, cluster_control_set, runtime_limit_set
from cleanup_ops.health import clusters_judged
from cleanup_ops.models import LimitName
from cleanup_ops.ratelimit import RUNTIME_LIMITS_CACHE_SECONDS
from cleanup_ops.recovery.operator import MIN_REASON_LENGTH
from cleanup_ops.views.common import bad_input_as_400, bad_request, redirect_back, render_live
from retention.actors import request_actor
from retention.inputs import MAX_TEXT_LENGTH, text_check


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
    controls = cluster_controls([cluster["hb"] for cluster in judged["clusters"]])
    for cluster in judged["clusters"]:
        cluster["host_leases"] = w["host_leases"].get(cluster["hb"].host, empty)
        cluster["control"] = controls.get((cluster["hb"].host, cluster["hb"].cluster))
    context = {
        "w": w,
        "clusters": judged["clusters"],
        "broker": broker_status(),
        "waited": judged["waited_by_queue"],
        # Per queue, how to start a cluster for it: a purge cluster needs its
        # queue and the document store's address (issue 30, item 2).
        "queues": queue_clusters(now=now, queues=queues()),
        "can_control": request.user.has_perm(CLUSTER_CONTROL_PERMISSION),
        "decisions": ClusterDecision.choices,
        "min_reason": MIN_REASON_LENGTH,
        "limits": limits_now(),
        "limits_cache_seconds": RUNTIME_LIMITS_CACHE_SECONDS,
    }
    return render_live(request, "console/workers.html", context)


@login_required
@require_POST
@permission_required("cleanup_ops.view_workerheartbeat", raise_exception=True)
@permission_required(CLUSTER_CONTROL_PERMISSION, raise_exception=True)
@bad_input_as_400
def cluster_control(request: HttpRequest) -> HttpResponse:
    """Quiet, drain (finish, then stop) or resume one cluster (``cluster``:
    ``<name>@<host>``, as the workers page lists it), with a reason; back to
    the workers page with what was done, or why not."""
    raw = request.POST.get("operation")
    if raw not in ClusterDecision.values:
        return bad_request(request, "operation", "operation must be quiet, drain or resume.")
    name, _, host = text_check(request.POST.get("cluster", ""), field="cluster", max_length=400).partition("@")
    if not name or not host:
        return bad_request(request, "cluster", "cluster must be <name>@<host>, as the workers page lists it.")
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    decision = ClusterDecision(raw)
    try:
        control = cluster_control_set(
            actor=request_actor(request), host=host, cluster=name, decision=decision, reason=reason
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        said = {
            ClusterDecision.QUIET: "is quiet: it takes no new work; slices already running finish",
            ClusterDecision.DRAIN: "is draining: it takes no new work and stops once its running slices end",
            ClusterDecision.RESUME: "takes new work again",
        }[decision]
        messages.success(request, f"{control.cluster}@{control.host} (pid {control.pid}) {said}.")
    return redirect_back(request, "console:workers")


_NUMBER = re.compile(r"\A[0-9]{1,7}(\.[0-9]{1,3})?\Z")


@login_required
@require_POST
@permission_required("cleanup_ops.view_workerheartbeat", raise_exception=True)
@permission_required(CLUSTER_CONTROL_PERMISSION, raise_exception=True)
@bad_input_as_400
def limit_change(request: HttpRequest) -> HttpResponse:
    """Change a rate limit or the lease cap at run time (``limit``, ``value``;
    an empty value puts the setting's back), with a reason; back to the
    workers page with what was done, or why not."""
    name = request.POST.get("limit")
    if name not in LimitName.values:
        return bad_request(request, "limit", f"limit must be one of {', '.join(LimitName.values)}.")
    raw = (request.POST.get("value") or "").strip()
    if raw and not _NUMBER.match(raw):
        return bad_request(request, "value", "value must be a number such as 2 or 0.5, or empty for the setting's.")
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    try:
        now = runtime_limit_set(
            actor=request_actor(request), name=name, value=float(raw) if raw else None, reason=reason
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"{LimitName(name).label}: now {now:g}; every worker uses it within seconds.")
    return redirect_back(request, "console:workers")
