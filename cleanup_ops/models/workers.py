"""What every worker process shares besides the jobs: the token buckets of the
rate limiter (``cleanup_ops.ratelimit``) and each cluster's heartbeat
(``cleanup_ops.health``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models


class RateBucket(models.Model):
    """A token bucket shared by every worker process on every host.

    ``tokens`` as of ``updated_at`` (epoch seconds); refill is computed in the
    acquiring UPDATE itself, so there is no background refill process.
    """

    name = models.CharField(max_length=60, primary_key=True)
    tokens = models.FloatField()
    updated_at = models.FloatField()

    def __str__(self) -> str:
        return f"{self.name}: {self.tokens:.1f}"


class WorkerHeartbeat(models.Model):
    """One row per worker cluster, written by its own workers (``cleanup_ops.health``).

    A cluster is one ``qcluster`` process tree on one host, named by
    ``Q_CLUSTER_NAME``. ``pid`` is its sentinel (the parent of its workers):
    a new value means the cluster was restarted, and ``started_at`` restarts
    with it. ``last_progress_at`` is when one of its workers last finished a
    task. A cluster with due work it could take and no progress for a while is
    wedged, not idle (``cleanup_health --liveness``).
    """

    host = models.CharField(max_length=255)
    cluster = models.CharField(max_length=100)
    # The django-q2 queue the cluster serves (Q_CLUSTER_NAME); "" on rows
    # written before heartbeats named it (read as the main queue).
    queue = models.CharField(max_length=40, blank=True, default="", db_default="")
    pid = models.PositiveIntegerField(help_text="The cluster's sentinel process (parent of its workers).")
    started_at = models.DateTimeField(help_text="When this run of the cluster (this pid) spawned its first worker.")
    last_progress_at = models.DateTimeField(null=True, blank=True, help_text="When a worker last finished a task.")
    turns = models.PositiveBigIntegerField(default=0, help_text="Tasks finished by this run of the cluster.")
    jobs_leased = models.PositiveBigIntegerField(default=0, help_text="Jobs leased by this run of the cluster.")
    rows_deleted = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["host", "cluster"]
        constraints = [models.UniqueConstraint(fields=["host", "cluster"], name="heartbeat_one_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}@{self.host}"


class ClusterMode(models.TextChoices):
    RUNNING = "running", "Running"
    QUIET = "quiet", "Quiet (takes no new work)"
    DRAINING = "draining", "Draining (finishes its work, then stops)"


class ClusterControl(models.Model):
    """An operator's decision about one worker cluster (a heartbeat's host and
    cluster), for the run of it that was up then (its sentinel's ``pid``): a
    restarted cluster (a new pid) is running again, whatever this row says.

    *Quiet*: its workers lease nothing new (a message they fetch is dropped;
    the dispatcher re-sends the job after ``CLEANUP_LEASE_SECONDS``, to
    whichever cluster takes it); slices already running finish. *Draining*:
    quiet, and once the cluster holds no live lease a worker of it sends its
    sentinel SIGTERM (django-q2's graceful stop). Each change has a reason and
    an audit event (``cleanup_ops.fleet``)."""

    Mode = ClusterMode

    host = models.CharField(max_length=255)
    cluster = models.CharField(max_length=100)
    pid = models.PositiveIntegerField(help_text="The run of the cluster the decision is about (its sentinel).")
    mode = models.CharField(max_length=10, choices=ClusterMode.choices, default=ClusterMode.RUNNING)
    reason = models.TextField()
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    set_at = models.DateTimeField()
    stop_sent_at = models.DateTimeField(null=True, blank=True, help_text="When a draining cluster was told to stop.")

    class Meta:
        ordering = ["host", "cluster"]
        constraints = [models.UniqueConstraint(fields=["host", "cluster"], name="cluster_control_one_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster}@{self.host}: {self.mode}"

    def _decide(self, mode: str, *, pid: int, by: Any, at: datetime, reason: str) -> None:
        self.mode, self.pid, self.set_by, self.set_at, self.reason = mode, pid, by, at, reason
        self.stop_sent_at = None
        if self.pk is None:
            self.save()
        else:
            self.save(update_fields=["mode", "pid", "set_by", "set_at", "reason", "stop_sent_at"])

    def mark_quiet(self, *, pid: int, by: Any, at: datetime, reason: str) -> None:
        self._decide(ClusterMode.QUIET, pid=pid, by=by, at=at, reason=reason)

    def mark_draining(self, *, pid: int, by: Any, at: datetime, reason: str) -> None:
        self._decide(ClusterMode.DRAINING, pid=pid, by=by, at=at, reason=reason)

    def mark_running(self, *, pid: int, by: Any, at: datetime, reason: str) -> None:
        self._decide(ClusterMode.RUNNING, pid=pid, by=by, at=at, reason=reason)

    def mark_stop_sent(self, *, at: datetime) -> None:
        self.stop_sent_at = at
        self.save(update_fields=["stop_sent_at"])


class LimitName(models.TextChoices):
    RATE_GLOBAL = "rate_global", "Batches per second, every worker (CLEANUP_RATE_GLOBAL)"
    RATE_PORTFOLIO = "rate_portfolio", "Batches per second per portfolio (CLEANUP_RATE_PORTFOLIO)"
    PORTFOLIO_MAX_LEASES = "portfolio_max_leases", "Leases per portfolio (CLEANUP_PORTFOLIO_MAX_LEASES)"
    SLICE_SECONDS = "slice_seconds", "Seconds of work per job turn, at most the setting's (CLEANUP_SLICE_SECONDS)"


class RuntimeLimit(models.Model):
    """An operator's run-time value for one of the pipeline's limits, in
    place of its setting until removed (``cleanup_ops.fleet.runtime_limit_set``;
    read by ``cleanup_ops.ratelimit.limit_value``). Each change has a reason
    and an audit event."""

    Name = LimitName

    name = models.CharField(max_length=30, choices=LimitName.choices, primary_key=True)
    value = models.FloatField()
    reason = models.TextField()
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    set_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} = {self.value:g}"

    def mark_changed(self, *, value: float, by: Any, at: datetime, reason: str) -> None:
        self.value, self.set_by, self.set_at, self.reason = value, by, at, reason
        self.save(update_fields=["value", "set_by", "set_at", "reason"])
