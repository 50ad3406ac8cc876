"""``/metrics``: the Prometheus exporter (gauges of the pipeline's figures), and who may scrape it.

Kept apart from the console's views: it serves scrapers, not people, and
answers with a token or an allowed address rather than a login."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cleanup_ops.console_selectors.overview import overview
from cleanup_ops.metrics import register_alert_metrics, register_process_metrics

# the proxy's (loopback when it runs on the same host), not the client's. A
# TLS proxy that sends only ``X-Forwarded-Proto`` (what SECURE_PROXY_SSL_HEADER
# reads) is a proxy all the same, so every ``X-Forwarded-*`` header counts.
PROXY_HEADERS = frozenset(
    {
        "HTTP_FORWARDED",
        "HTTP_VIA",
        "HTTP_X_REAL_IP",
        "HTTP_X_CLIENT_IP",
        "HTTP_TRUE_CLIENT_IP",
        "HTTP_CF_CONNECTING_IP",
        "HTTP_FASTLY_CLIENT_IP",
        "HTTP_X_CLUSTER_CLIENT_IP",
        "HTTP_X_PROXYUSER_IP",
    }
)
PROXY_HEADER_PREFIXES = ("HTTP_X_FORWARDED_", "HTTP_X_ORIGINAL_")


def came_through_a_proxy(request: HttpRequest) -> bool:
    return any(name in PROXY_HEADERS or name.startswith(PROXY_HEADER_PREFIXES) for name in request.META)


def metrics_allowed(request: HttpRequest) -> bool:
    """The bearer token, or a direct (unproxied) connection from an address
    the operator listed in ``METRICS_ALLOWED_IPS`` (empty by default: only
    the token).

    Behind a reverse proxy on the same host every request arrives from
    loopback, so an address is trusted only when no proxy header at all is
    present (``Forwarded``, ``Via``, any ``X-Forwarded-*`` — including a lone
    ``X-Forwarded-Proto`` — ``X-Real-IP``, …); a proxied scrape must send the
    token. Bytes are compared, so a non-ASCII header is a mismatch rather
    than a ``TypeError``.
    """
    token = settings.METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        if hmac.compare_digest(header.encode("utf-8", "surrogatepass"), f"Bearer {token}".encode()):
            return True
    if not settings.METRICS_ALLOWED_IPS or came_through_a_proxy(request):
        return False
    return request.META.get("REMOTE_ADDR") in settings.METRICS_ALLOWED_IPS


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """``/metrics`` for Prometheus: a bearer token (``METRICS_TOKEN``) or an allowed client address."""
    if not metrics_allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    f = overview()
    registry = CollectorRegistry()
    jobs = Gauge("retention_jobs", "Cleanup jobs by state", ["state"], registry=registry)
    for state, n in f["jobs_by_state"].items():
        jobs.labels(state).set(n)
    Gauge("retention_rows_deleted_24h", "Rows deleted in the last 24 hours", registry=registry).set(
        f["rows_deleted_24h"]
    )
    Gauge("retention_leases_active", "Live leases", registry=registry).set(f["leased"])
    Gauge("retention_paused", "1 when the whole pipeline is paused", registry=registry).set(int(f["paused"]))
    Gauge("retention_oldest_due_job_age_seconds", "Age of the oldest due job", registry=registry).set(
        f["oldest_due_age_seconds"] or 0
    )
    Gauge("retention_dead_letters_open", "Open dead letters", registry=registry).set(f["dead_letters"]["open"])
    retries = Gauge("retention_retries", "Failed attempts by category", ["category"], registry=registry)
    for category, n in f["retries_by_category"].items():
        retries.labels(category).set(n)
    debt = Gauge(
        "retention_debt_records", "Records past their cutoff, not deleted", ["record_kind", "held"], registry=registry
    )
    for row in f["retention_debt"]:
        debt.labels(row["record_kind"], "false").set(row["overdue"])
        debt.labels(row["record_kind"], "true").set(row["held"])
    # What the alerting rules read (docs/deploy/prometheus-rules.yaml), and the trigger histogram.
    register_alert_metrics(registry, figures=f, now=timezone.now())
    register_process_metrics(registry)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
