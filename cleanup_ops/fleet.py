"""The scaled-to-zero fleet: how much work wants a worker, and a drain that
waits for more before it exits.

Two fleet modes keep the same delivery contract (the job table decides; a
worker only ever leases due work; every batch is fenced):

* **warm**: ``qcluster`` runs all the time and picks up work within a second
  or so (finished turns and the minute dispatcher wake it);
* **scaled to zero**: no worker process runs while nothing is due. Something
  outside the product watches *due work* (``due_work_q``: due, or held by a
  live lease, outside every pause) and starts a worker when there is any:

  - on Kubernetes, KEDA runs the same predicate as SQL
    (``docs/deploy/keda-scaledobject.yaml``) every ``pollingInterval`` and
    scales the ``qcluster`` Deployment from zero; after ``cooldownPeriod``
    with none it scales it back to zero (so the idle time lives in KEDA);
  - with systemd, a timer runs ``cleanup_health --due`` (exit 0 when there is
    due work) as the drain unit's ``ExecCondition``, and the unit runs
    ``cleanup_drain --until-idle`` (``drain_until_idle`` below), which exits
    once nothing has been due for ``CLEANUP_IDLE_EXIT_SECONDS``.

Work becomes due in three ways and each is picked up within the mode's bound
(docs/deploying.md, "Fleet modes"): a sweep's jobs (admission), a retry's
``available_at`` passing, and a redrive (a new job, due at once).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, connection, models, transaction
from django.db.models import Count
from django.utils import timezone

from cleanup_ops import clock
from cleanup_ops.execution.runner import cleanup_drain, stop_on_sigterm, stop_requested
from cleanup_ops.health import cluster_identity, heartbeat_record_turn
from cleanup_ops.models import CleanupJob, ClusterControl, ClusterMode, LimitName, RuntimeLimit, WorkerHeartbeat
from cleanup_ops.ratelimit import limit_setting, runtime_limits_forget
from cleanup_ops.recovery.operator import operator_reason
from retention.actors import Actor
from retention.services import audit_event_record

logger = logging.getLogger(__name__)

# How often a drain waiting for work looks for it: one indexed count per poll,
# only while a worker is up and idle.
IDLE_POLL_SECONDS = 1.0


def due_work_count(*, now: datetime | None = None, kinds: Collection[str] | None = None) -> int:
    """Jobs (of ``kinds``, default every kind) that want a worker now."""
    qs = CleanupJob.objects.due_work(now=now or timezone.now())
    if kinds is not None:
        qs = qs.filter(job_kind__in=list(kinds))
    return qs.count()


def due_work_by_kind(*, now: datetime | None = None) -> dict[str, int]:
    """``due_work_count`` per job kind, in one query (every kind present, 0 when none)."""
    counts = dict(
        CleanupJob.objects.due_work(now=now or timezone.now())
        .values_list("job_kind")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {kind: counts.get(kind, 0) for kind in CleanupJob.Kind.values}


@dataclass
class IdleDrainResult:
    slices: int = 0
    rows_deleted: int = 0
    documents_purged: int = 0
    busy_seconds: float = 0.0  # draining
    idle_seconds: float = 0.0  # waiting for work before exiting
    exit_reason: str = ""  # "idle" or "stopped" (SIGTERM)


def drain_until_idle(
    *,
    idle_seconds: float | None = None,
    poll: float = IDLE_POLL_SECONDS,
    progress: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> IdleDrainResult:
    """Drain due work; when none is left, keep looking every ``poll`` seconds
    and drain again as soon as some is due; exit once nothing has been due for
    ``idle_seconds`` (default ``CLEANUP_IDLE_EXIT_SECONDS``) or on SIGTERM.

    The idle clock restarts whenever due work is seen, including work another
    worker holds a live lease on (it may hand it back, cursor saved, for a
    next slice). Each slice counts as progress on the heartbeat, as a worker's
    turn does, so the console and the alerts see a drain like a cluster.
    """
    idle_limit = float(settings.CLEANUP_IDLE_EXIT_SECONDS if idle_seconds is None else idle_seconds)
    stop_on_sigterm()

    def beat(done: int, total: int) -> None:
        # Progress for the heartbeat (at most one write per CLEANUP_HEARTBEAT_SECONDS),
        # so a long drain never looks like a fleet without workers.
        heartbeat_record_turn()
        if progress:
            progress(done, total)

    result = IdleDrainResult()
    idle_since = clock()
    while True:
        if stop_requested():
            result.exit_reason = "stopped"
            return result
        try:
            due = due_work_count()
        except DatabaseError as exc:
            # A restarting database: drop the broken connection, look again
            # next poll; the idle clock runs on (a long outage ends the drain,
            # and the timer or KEDA starts a new one when work is due).
            logger.warning("drain: due work not readable: %s", type(exc).__name__)
            connection.close()
            due = 0
        if due:
            started = clock()
            run = cleanup_drain(progress=beat)
            result.busy_seconds += clock() - started
            result.slices += run.slices
            result.rows_deleted += run.rows_deleted
            result.documents_purged += run.documents_purged
            heartbeat_record_turn(rows_deleted=run.rows_deleted)
            idle_since = clock()
            if run.slices:
                continue
            # Due work this process could not take (another worker's live
            # lease, a portfolio at its lease cap): wait a poll, stay up.
        elif clock() - idle_since >= idle_limit:
            result.exit_reason = "idle"
            return result
        waited = clock()
        sleep(poll)
        result.idle_seconds += clock() - waited


# --- Quiet and drain of a worker cluster -----------------------------------------

# The operator's pause permission: quieting a cluster is pausing it.
CLUSTER_CONTROL_PERMISSION = "cleanup_ops.add_pipelinepause"


class ClusterDecision(models.TextChoices):
    QUIET = "quiet", "Quiet"
    DRAIN = "drain", "Drain and stop"
    RESUME = "resume", "Resume"


def cluster_control_set(
    *, actor: Actor | None, host: str, cluster: str, decision: ClusterDecision, reason: str
) -> ClusterControl:
    """Quiet a cluster, drain it (finish, then stop), or resume it; with a
    typed reason (the product's reason rule) and an audit event
    (``cluster.quieted``, ``cluster.draining``, ``cluster.resumed``) naming
    the cluster and its pid, never anything of the work. The cluster is the
    one a heartbeat names; the decision binds the run of it that is up now."""
    if actor is not None and not actor.has_perm(CLUSTER_CONTROL_PERMISSION):
        raise PermissionDenied(f"You do not have the {CLUSTER_CONTROL_PERMISSION} permission.")
    reason = operator_reason(reason)
    heartbeat = WorkerHeartbeat.objects.filter(host=host, cluster=cluster).first()
    if heartbeat is None:
        raise ValidationError({"cluster": f"no cluster {cluster!r} on host {host!r} has reported"})
    now = clock.now()
    with transaction.atomic():
        control = ClusterControl.objects.select_for_update().filter(host=host, cluster=cluster).first()
        control = control or ClusterControl(host=host, cluster=cluster)
        before = control.mode if control.pk is not None and control.pid == heartbeat.pid else ClusterMode.RUNNING
        if decision == ClusterDecision.RESUME and before == ClusterMode.RUNNING:
            raise ValidationError({"operation": f"{cluster}@{host} is running: nothing to resume"})
        if decision == ClusterDecision.QUIET and before == ClusterMode.QUIET:
            raise ValidationError({"operation": f"{cluster}@{host} is already quiet"})
        if decision == ClusterDecision.DRAIN and before == ClusterMode.DRAINING:
            raise ValidationError({"operation": f"{cluster}@{host} is already draining"})
        mark = {
            ClusterDecision.QUIET: control.mark_quiet,
            ClusterDecision.DRAIN: control.mark_draining,
            ClusterDecision.RESUME: control.mark_running,
        }[decision]
        mark(pid=heartbeat.pid, by=actor, at=now, reason=reason)
        action = {"quiet": "cluster.quieted", "drain": "cluster.draining", "resume": "cluster.resumed"}[decision]
        audit_event_record(
            actor=actor,
            action=action,
            object_type="worker_cluster",
            object_id=f"{cluster}@{host}",
            reason=reason,
            details={"pid": heartbeat.pid, "from": str(before), "to": str(control.mode)},
        )
    return control


def cluster_mode(*, host: str, cluster: str, pid: int | None) -> str:
    """The mode an operator set for this run of the cluster (``pid``, its
    sentinel); running when none was set, or it was set for an earlier run."""
    control = ClusterControl.objects.filter(host=host, cluster=cluster).values_list("mode", "pid").first()
    if control is None or (pid is not None and control[1] != pid):
        return ClusterMode.RUNNING
    return control[0]


def cluster_takes_work(*, stop: Callable[[int], None] | None = None) -> bool:
    """Whether this worker's cluster takes new work (one indexed read per
    task). A draining cluster whose workers hold no live lease any more is
    then told to stop: its sentinel (the worker's parent, the heartbeat's
    ``pid``) gets SIGTERM, once."""
    host, cluster = cluster_identity()
    sentinel = os.getppid()
    mode = cluster_mode(host=host, cluster=cluster, pid=sentinel)
    if mode == ClusterMode.RUNNING:
        return True
    if mode == ClusterMode.DRAINING:
        cluster_drain_finish(host=host, cluster=cluster, pid=sentinel, stop=stop)
    return False


def cluster_drain_finish(*, host: str, cluster: str, pid: int, stop: Callable[[int], None] | None = None) -> bool:
    """Stop a draining cluster that holds no live lease (on its host); True if told now."""
    now = clock.now()
    holding = CleanupJob.objects.filter(
        state=CleanupJob.State.LEASED, lease_owner__startswith=f"{host}:", lease_expires_at__gt=now
    ).exists()
    if holding:
        return False
    with transaction.atomic():
        control = (
            ClusterControl.objects.select_for_update()
            .filter(host=host, cluster=cluster, pid=pid, mode=ClusterMode.DRAINING, stop_sent_at__isnull=True)
            .first()
        )
        if control is None:
            return False
        control.mark_stop_sent(at=now)
        audit_event_record(
            actor=None,
            action="cluster.drained",
            object_type="worker_cluster",
            object_id=f"{cluster}@{host}",
            details={"pid": pid},
        )
    (stop or _sigterm)(pid)
    return True


def _sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


# --- Run-time limits ---------------------------------------------------------------

# What an operator may set at run time: (lowest, highest, whole numbers only).
LIMIT_BOUNDS: dict[str, tuple[float, float, bool]] = {
    LimitName.RATE_GLOBAL: (0, 100_000, False),  # 0: unlimited
    LimitName.RATE_PORTFOLIO: (0, 100_000, False),
    LimitName.PORTFOLIO_MAX_LEASES: (1, 1_000, True),
    # A cap only: up to the setting's value (``ratelimit.slice_seconds``), checked below.
    LimitName.SLICE_SECONDS: (0.1, 3_600, False),
}


def runtime_limit_set(*, actor: Actor | None, name: str, value: float | None, reason: str) -> float:
    """Change one of the pipeline's limits at run time (``value``), or put it
    back to its setting (``None``); with a typed reason and an audit event
    (``limits.changed``: the limit, its value before and after). Every
    worker uses the new value within ``ratelimit.RUNTIME_LIMITS_CACHE_SECONDS``.
    Returns the limit's value now."""
    if actor is not None and not actor.has_perm(CLUSTER_CONTROL_PERMISSION):
        raise PermissionDenied(f"You do not have the {CLUSTER_CONTROL_PERMISSION} permission.")
    if name not in LimitName.values:
        raise ValidationError({"limit": f"limit must be one of {', '.join(LimitName.values)}"})
    reason = operator_reason(reason)
    if value is not None:
        low, high, whole = LIMIT_BOUNDS[name]
        if not (low <= value <= high) or (whole and value != int(value)) or value != value:
            kind = "a whole number" if whole else "a number"
            raise ValidationError({"value": f"{name} must be {kind} from {low:g} to {high:g}"})
        if name == LimitName.SLICE_SECONDS and value > limit_setting(name):
            raise ValidationError(
                {"value": f"slice_seconds caps the setting's {limit_setting(name):g} s: it may be lower, not higher"}
            )
    with transaction.atomic():
        current = RuntimeLimit.objects.select_for_update().filter(name=name).first()
        before = current.value if current is not None else limit_setting(name)
        now = clock.now()
        if value is None:
            if current is None:
                raise ValidationError({"value": f"{name} already has its setting's value"})
            current.delete()
        elif current is None:
            RuntimeLimit.objects.create(name=name, value=value, set_by=actor, set_at=now, reason=reason)
        else:
            current.mark_changed(value=value, by=actor, at=now, reason=reason)
        after = limit_setting(name) if value is None else value
        audit_event_record(
            actor=actor,
            action="limits.changed",
            object_type="limit",
            object_id=name,
            reason=reason,
            details={"from": before, "to": after, "setting": value is None},
        )
    runtime_limits_forget()
    return after
