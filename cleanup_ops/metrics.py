"""What ``/metrics`` exports for the alerting rules (``docs/deploy/prometheus-rules.yaml``)
beyond the console's figures, and the trigger endpoint's latency histogram.

Every series carries identifiers, counts, ages and enumerations only — job
kinds, record kinds, forecast states, a cluster's host and name — never
record contents, and no portfolio (one series per customer would make
``/metrics`` a per-customer report; the console has those).

**The trigger latency histogram** is process-local, as prometheus_client
metrics are. Under gunicorn (several worker processes) set
``PROMETHEUS_MULTIPROC_DIR`` to an empty directory writable by the web
processes (``retention-web.service`` does, with ``RuntimeDirectory=``): each
process then writes its observations there and ``/metrics`` adds them up,
whichever process answers the scrape. Without it (one process, the tests),
the process's own histogram is exported.

**Clusters** are judged like the console's workers page
(``liveness_verdict``) from their heartbeats. A heartbeat row stays behind
when a cluster goes away for good (a pod scaled away, a retired host), and
from the database a vanished cluster looks like a wedged one, so rows not
written for ``CLUSTER_RETIRED_AFTER`` are left out; the rule
``RetentionDueWorkWithoutWorkers`` covers a fleet with no live cluster at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Min
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from cleanup_ops.console_selectors import ForecastStatus, sweep_forecast
from cleanup_ops.fleet import due_work_by_kind
from cleanup_ops.health import liveness_verdict
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep, WorkerHeartbeat, unpaused_q

# The trigger endpoint's latency objective: 99% of POST /api/v1/sweeps/ answer
# within this many seconds (admission runs inside the request: 10,000
# partitions took about 2 s on the benchmark machine). One bucket boundary
# sits exactly on it, so the rule can count the requests slower than it.
TRIGGER_OBJECTIVE_SECONDS = 5.0
TRIGGER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, TRIGGER_OBJECTIVE_SECONDS, 10.0, 30.0)

TRIGGER_LATENCY = Histogram(
    "retention_trigger_request_duration_seconds",
    "POST /api/v1/sweeps/ (the trigger endpoint): seconds from request to response, by HTTP status",
    ["code"],
    buckets=TRIGGER_BUCKETS,
    registry=None,  # added to each scrape's registry (or collected from PROMETHEUS_MULTIPROC_DIR)
)

CLUSTER_RETIRED_AFTER = timedelta(hours=1)

FORECAST_STATES = (
    ForecastStatus.DONE,
    ForecastStatus.MEASURING,
    ForecastStatus.ON_TIME,
    ForecastStatus.LATE,
    ForecastStatus.STALLED,
    ForecastStatus.OVERRAN,
)


def trigger_observe(*, seconds: float, status: int) -> None:
    TRIGGER_LATENCY.labels(str(status)).observe(seconds)


def timed_trigger(handler: Callable[[], Any]) -> Any:
    """Run the trigger request ``handler`` (returning a response with
    ``status_code``) and observe its latency, whatever it answered."""
    started = time.perf_counter()
    response = handler()
    trigger_observe(seconds=time.perf_counter() - started, status=int(response.status_code))
    return response


def register_process_metrics(registry: CollectorRegistry) -> None:
    """The trigger histogram: from every web process when
    ``PROMETHEUS_MULTIPROC_DIR`` is set, else from this one."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(TRIGGER_LATENCY)


class _DeadLettersCreated(Collector):
    """Dead letters ever written, as a counter: letters are never deleted
    (redriven and dismissed ones stay), so the count only grows and
    ``increase()`` gives the growth rate."""

    def __init__(self, total: int) -> None:
        self.total = total

    def collect(self) -> list[CounterMetricFamily]:
        family = CounterMetricFamily(
            "retention_dead_letters_created", "Dead letters written since the start (never deleted)"
        )
        family.add_metric([], self.total)
        return [family]


def register_alert_metrics(registry: CollectorRegistry, *, figures: dict[str, Any], now: datetime) -> None:
    """The series the alerting rules read, beside the console's (``figures``
    is ``console_selectors.overview.overview()``, already computed for the scrape). Five
    queries: dead letters, due work (two), the current sweep's forecast,
    heartbeats."""
    registry.register(_DeadLettersCreated(DeadLetter.objects.count()))
    Gauge(
        "retention_dead_letters_oldest_open_age_seconds",
        "Age of the oldest open dead letter (since it was last seen failing); 0 when none is open",
        registry=registry,
    ).set(figures["dead_letters"]["oldest_open_age_seconds"] or 0)

    on_time = Gauge(
        "retention_debt_on_time_ratio",
        "Share of eligible records deleted within a day of becoming eligible (objective: 0.99)",
        ["record_kind"],
        registry=registry,
    )
    for row in figures["retention_debt"]:
        on_time.labels(row["record_kind"]).set(row["on_time_share"])

    due = Gauge(
        "retention_due_work_jobs",
        "Jobs that want a worker: due or held by a live lease, outside every pause (what KEDA scales on)",
        ["job_kind"],
        registry=registry,
    )
    for kind, n in due_work_by_kind(now=now).items():
        due.labels(kind).set(n)
    oldest = CleanupJob.objects.due(now=now).filter(unpaused_q()).aggregate(at=Min("available_at"))["at"]
    waited = (now - oldest).total_seconds() if oldest else None
    Gauge(
        "retention_due_work_oldest_age_seconds",
        "How long the oldest due job outside every pause has been due; 0 when none is",
        registry=registry,
    ).set(max(0.0, waited or 0.0))

    _forecast_metrics(registry, now=now)
    _cluster_metrics(registry, now=now, waited=waited)


def _forecast_metrics(registry: CollectorRegistry, *, now: datetime) -> None:
    sweep = Sweep.objects.order_by("-slot").first()
    forecast = None
    if sweep is not None and sweep.status in {Sweep.Status.ADMITTING, Sweep.Status.RUNNING}:
        forecast = sweep_forecast(sweep, now=now, portfolio_ids=None)
    current = forecast.status if forecast else ForecastStatus.DONE
    states = Gauge(
        "retention_sweep_forecast",
        "1 for the current sweep's drain forecast state (done when no sweep is running)",
        ["status"],
        registry=registry,
    )
    for status in FORECAST_STATES:
        states.labels(status).set(int(status == current))
    Gauge(
        "retention_sweep_open_jobs", "Open jobs of the current sweep (0 when none is running)", registry=registry
    ).set(forecast.remaining if forecast else 0)
    Gauge(
        "retention_sweep_seconds_to_next_slot",
        "Seconds until the schedule's next slot after the current sweep's (negative: it has begun)",
        registry=registry,
    ).set(forecast.seconds_to_next_slot if forecast else 0)


def _cluster_metrics(registry: CollectorRegistry, *, now: datetime, waited: float | None) -> None:
    stale = float(settings.CLEANUP_LIVENESS_STALE_SECONDS)
    age = Gauge(
        "retention_cluster_heartbeat_age_seconds",
        "Seconds since the cluster last wrote its heartbeat",
        ["host", "cluster"],
        registry=registry,
    )
    wedged = Gauge(
        "retention_cluster_wedged",
        "1 when due work waited CLEANUP_LIVENESS_STALE_SECONDS and the cluster made no progress for as long",
        ["host", "cluster"],
        registry=registry,
    )
    for hb in WorkerHeartbeat.objects.filter(updated_at__gte=now - CLUSTER_RETIRED_AFTER).order_by("host", "cluster"):
        state, _quiet = liveness_verdict(waited=waited, heartbeat=hb, now=now, stale=stale)
        age.labels(hb.host, hb.cluster).set(max(0.0, (now - hb.updated_at).total_seconds()))
        wedged.labels(hb.host, hb.cluster).set(int(state == "wedged"))
