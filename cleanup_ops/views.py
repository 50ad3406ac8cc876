"""Operator console: server-rendered pages, login required, role-aware.

Every page issues a fixed number of queries whatever the data size (the
figures come from aggregate selectors; lists are paginated). Writes go through
services, need a reason, and leave audit events; the dead-letter actions add a
confirmation step before anything changes.

A customer's staff (a membership whose role reaches a page) see their
portfolios only: every figure, list and export below is narrowed with
``retention.scoping``; sweeps themselves are the platform's schedule and
visible to every role that reaches them, with the customer's own figures.
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cleanup_ops.charts import bar_chart
from cleanup_ops.console_selectors import (
    drain_forecast,
    job_detail,
    job_filter_parse,
    jobs_page,
    next_slot_after,
    pauses_overview,
    portfolio_choices,
    portfolio_names,
    portfolio_summary,
    sweep_forecast,
    sweeps_history,
    workers_overview,
)
from cleanup_ops.dispatch import broker_status
from cleanup_ops.metrics import register_alert_metrics, register_process_metrics
from cleanup_ops.models import CleanupJob, DeadLetter, JobKind, JobState, Sweep
from cleanup_ops.proof import PROOF_FORMATS, proof_csv, sweep_proof
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import (
    MIN_REASON_LENGTH,
    Decision,
    dead_letters_dismiss_bulk,
    dead_letters_redrive_bulk,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.selectors import (
    THROUGHPUT_HOURS,
    DeadLetterFilter,
    dead_letter_filter_parse,
    dead_letters,
    overview,
    sweep_attachments,
    sweep_figures_seen,
    sweeps_seen,
    throughput,
)
from retention.filters import audit_events, audit_filter_parse, id_param
from retention.models import AuditEvent
from retention.registry import RECORD_KIND_CHOICES
from retention.scoping import (
    portfolio_ids_q,
    portfolios_visible_to,
    scope_audit_events,
    scope_queryset,
    visible_portfolio_ids,
)

VIEW_PERM = "cleanup_ops.view_cleanupjob"
PAGE_SIZE = 50


# --- Live fragments and charts -------------------------------------------------

LIVE_TARGET = "live"


def refresh_seconds() -> int:
    """How often a live page re-fetches its fragment (``CONSOLE_REFRESH_SECONDS``)."""
    return int(getattr(settings, "CONSOLE_REFRESH_SECONDS", 10))


def render_live(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    """A live page: the whole page, or only its ``#live`` fragment
    (``<name>_live.html``) when the poller in ``static/console/console.js``
    asks for it (htmx sends ``HX-Request`` and ``HX-Target``)."""
    context = {**context, "refresh_seconds": refresh_seconds(), "live_target": LIVE_TARGET}
    if request.headers.get("HX-Request") == "true" and request.headers.get("HX-Target") == LIVE_TARGET:
        template = template.replace(".html", "_live.html")
    response = render(request, template, context, status=status)
    response["Vary"] = "HX-Request, HX-Target"
    return response


# Chart time ranges (hours); above 48 h the bars are 6-hour buckets.
CHART_HOURS = (6, 12, 24, 48, 168)


def chart_hours(raw: str | None) -> int:
    try:
        hours = int(raw or THROUGHPUT_HOURS)
    except ValueError:
        return THROUGHPUT_HOURS
    return hours if hours in CHART_HOURS else THROUGHPUT_HOURS


LONG_RANGE_CACHE_SECONDS = 60


def throughput_cached(*, now: datetime, hours: int, scope: frozenset[int] | None) -> list[dict[str, Any]]:
    """A long range (days of ledger rows) at most once a minute per process,
    scope and hour: hourly buckets move on the scale of hours, not seconds."""
    scope_key = "all" if scope is None else ",".join(map(str, sorted(scope)))
    key = f"console:throughput:{hours}:{now:%Y%m%dT%H}:{scope_key}"
    return cache.get_or_set(
        key, lambda: throughput(now=now, hours=hours, portfolio_ids=scope), LONG_RANGE_CACHE_SECONDS
    )


def throughput_chart(points: list[dict[str, Any]], *, hours: int) -> dict[str, Any]:
    """Rows deleted per hour (or per 6 hours above two days), labelled in UTC."""
    bucket = 1 if hours <= 48 else 6
    bars: list[tuple[str, int]] = []
    for i in range(0, len(points), bucket):
        chunk = points[i : i + bucket]
        start = datetime.fromisoformat(chunk[0]["hour"])
        label = f"{start:%H}h" if hours <= 24 else f"{start:%a %H}h"
        bars.append((label, sum(p["rows"] for p in chunk)))
    unit = "hour" if bucket == 1 else f"{bucket} hours"
    return bar_chart(bars, x_label=f"UTC, last {hours} h (one bar per {unit})", y_label=f"rows deleted per {unit}")


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def overview_page(request: HttpRequest) -> HttpResponse:
    scope = visible_portfolio_ids(request.user)
    now = timezone.now()
    hours = chart_hours(request.GET.get("hours"))
    figures = overview(now=now, portfolio_ids=scope)
    points = (
        figures["throughput"] if hours == THROUGHPUT_HOURS else throughput_cached(now=now, hours=hours, scope=scope)
    )
    sweep = figures["current_sweep"]
    forecast = None
    if sweep is not None and sweep["status"] in {Sweep.Status.RUNNING, Sweep.Status.ADMITTING}:
        current = Sweep.objects.filter(pk=sweep["id"]).first()
        forecast = sweep_forecast(current, now=now, portfolio_ids=scope) if current else None
    names = portfolio_names(
        [p["portfolio_id"] for p in figures["fairness"]] + [p["portfolio_id"] for p in figures["pauses"]]
    )
    return render_live(
        request,
        "console/overview.html",
        {
            "f": figures,
            "names": names,
            "forecast": forecast,
            "hours": hours,
            "hour_choices": CHART_HOURS,
            "throughput_chart": throughput_chart(points, hours=hours),
            "retries_chart": bar_chart(
                [
                    (FailureCategory(c).label if c in FailureCategory.values else c, n)
                    for c, n in figures["retries_by_category"].items()
                ],
                x_label="failure category (current sweep and open jobs)",
                y_label="failed attempts",
            ),
            "can_pause": request.user.has_perm("cleanup_ops.add_pipelinepause"),
        },
    )


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def sweep_page(request: HttpRequest, sweep_id: int) -> HttpResponse:
    scope = visible_portfolio_ids(request.user)
    sweep = get_object_or_404(sweeps_seen(portfolio_ids=scope), pk=sweep_id)
    figures = {
        "status": sweep.status,
        "jobs_admitted": sweep.jobs_admitted,
        "carried_over": sweep.carried_over,
        **sweep_figures_seen(sweep),
    }
    outcomes = list(
        CleanupJob.objects.filter(portfolio_ids_q(scope), sweep=sweep)
        .values("kind", "state", "outcome")
        .annotate(n=Count("id"))
        .order_by("kind", "state", "outcome")
    )
    letters = list(DeadLetter.objects.filter(portfolio_ids_q(scope), sweep=sweep).order_by("-id")[:PAGE_SIZE])
    forecast = None
    if figures["status"] in {Sweep.Status.ADMITTING, Sweep.Status.RUNNING}:
        forecast = sweep_forecast(sweep, now=timezone.now(), portfolio_ids=scope)
    return render_live(
        request,
        "console/sweep.html",
        {
            "sweep": sweep,
            "figures": figures,
            "outcomes": outcomes,
            "letters": letters,
            "forecast": forecast,
            "names": portfolio_names(letter.portfolio_id for letter in letters),
            "attachments": sweep_attachments(sweep_id=sweep.pk, portfolio_ids=scope),
        },
    )


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def sweep_proof_export(request: HttpRequest, sweep_id: int, fmt: str) -> HttpResponse:
    if fmt not in PROOF_FORMATS:
        # Checked first: the format ends up in the Content-Disposition header.
        return HttpResponse("format must be csv or json\n", status=400, content_type="text/plain")
    proof = sweep_proof(sweep=get_object_or_404(Sweep, pk=sweep_id), portfolio_ids=visible_portfolio_ids(request.user))
    if fmt == "csv":
        response = HttpResponse(proof_csv(proof), content_type="text/csv")
    else:
        response = JsonResponse(proof)
    response["Content-Disposition"] = f'attachment; filename="proof-{proof["key"].replace(":", "_")}.{fmt}"'
    return response


@login_required
@permission_required("cleanup_ops.view_deadletter", raise_exception=True)
def dead_letter_inbox(request: HttpRequest) -> HttpResponse:
    letter_filter = dead_letter_filter_parse(request.GET, strict=False, default_status=DeadLetter.Status.OPEN)
    letters = scope_queryset(dead_letters(letter_filter), request.user)
    page = Paginator(letters, PAGE_SIZE).get_page(request.GET.get("page"))
    return render_live(
        request,
        "console/dead_letters.html",
        {
            "page": page,
            "names": portfolio_names(letter.portfolio_id for letter in page),
            "portfolios": portfolio_choices(portfolio_ids=visible_portfolio_ids(request.user)),
            "bulk_params": {k: v for k, v in letter_filter.as_params().items() if k != "status"},
            "filters": letter_filter.as_params(),
            "categories": FailureCategory.values,
            "statuses": DeadLetter.Status.values,
            "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
            "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
        },
    )


@login_required
@require_POST
def dead_letter_action(request: HttpRequest) -> HttpResponse:
    """Step 1 (no ``confirm``): validate and show a confirmation page. Step 2: apply."""
    operation = request.POST.get("operation")
    if operation not in {"redrive", "dismiss"}:
        return HttpResponse("operation must be redrive or dismiss", status=400)
    perm = f"cleanup_ops.{operation}_deadletter"
    if not request.user.has_perm(perm):
        raise PermissionDenied
    ids = [int(i) for i in request.POST.getlist("letter") if i.isdigit()]
    reason = request.POST.get("reason", "")
    letters = list(scope_queryset(DeadLetter.objects.filter(pk__in=ids), request.user).order_by("id"))
    errors = []
    if not letters:
        errors.append("Select at least one dead letter.")
    if len(reason.strip()) < MIN_REASON_LENGTH:
        errors.append(f"A reason of at least {MIN_REASON_LENGTH} characters is required; it goes into the audit trail.")
    if errors or request.POST.get("confirm") != "yes":
        return render(
            request,
            "console/dead_letter_confirm.html",
            {
                "operation": operation,
                "letters": letters,
                "reason": reason,
                "errors": errors,
                "next": request.POST.get("next", ""),
                "names": portfolio_names(letter.portfolio_id for letter in letters),
            },
            status=400 if errors else 200,
        )
    bulk = dead_letters_redrive_bulk if operation == "redrive" else dead_letters_dismiss_bulk
    try:
        result = bulk(
            actor=request.user,
            reason=reason,
            letter_filter=DeadLetterFilter(letter_ids=tuple(letter.pk for letter in letters)),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect_back(request, "console:dead_letters")
    failed = []
    if operation == "redrive":
        new_ids = ", ".join(str(job.pk) for job in result)
        messages.success(request, f"Redrove {len(result)} dead letter(s): new job(s) {new_ids or 'none'}.")
        failed = result.failed
        if failed:
            listed = ", ".join(f"{failure.letter_id} ({failure.error_class})" for failure in failed)
            messages.error(request, f"{len(failed)} letter(s) could not be redriven and are still open: {listed}.")
    else:
        messages.success(request, f"Dismissed {result} dead letter(s).")
    skipped = len(letters) - len(failed) - (len(result) if operation == "redrive" else result)
    if skipped:
        messages.warning(request, f"{skipped} letter(s) were no longer open and were left as they are.")
    return redirect_back(request, "console:dead_letters")


@login_required
@permission_required("retention.view_auditevent", raise_exception=True)
def audit_log(request: HttpRequest) -> HttpResponse:
    audit_filter = audit_filter_parse(request.GET, strict=False)
    events = scope_audit_events(audit_events(audit_filter), request.user)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    named = [e.details.get("portfolio_id") for e in page if isinstance(e.details, dict)]
    named += [int(e.object_id) for e in page if e.object_type == "portfolio" and e.object_id.isdigit()]
    names = portfolio_names(i for i in named if isinstance(i, int))
    return render(request, "console/audit.html", {"page": page, "filters": audit_filter.as_params(), "names": names})


@login_required
@require_http_methods(["POST"])
def pause_toggle(request: HttpRequest) -> HttpResponse:
    """Pause or resume the pipeline or one portfolio (``portfolio``: its id,
    from a select of portfolio names), with a reason; back to ``next``."""
    resume = request.POST.get("operation") == "resume"
    portfolio = request.POST.get("portfolio") or None
    try:
        portfolio_id = int(portfolio) if portfolio else None
        fn = pipeline_resume if resume else pipeline_pause
        fn(actor=request.user, reason=request.POST.get("reason", ""), portfolio_id=portfolio_id)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    except ValueError:
        messages.error(request, "portfolio must be an id")
    else:
        scope = "the whole pipeline"
        if portfolio_id is not None:
            scope = portfolio_names([portfolio_id]).get(portfolio_id, f"portfolio {portfolio_id}")
        messages.success(request, f"Resumed {scope}." if resume else f"Paused {scope}.")
    return redirect_back(request, "console:overview")


def redirect_back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """To the console page in ``next`` (a local path only), else ``default``."""
    target = request.POST.get("next") or ""
    if not (target.startswith("/console/") and url_has_allowed_host_and_scheme(target, allowed_hosts=None)):
        target = reverse(default)
    return HttpResponseRedirect(target)


# --- Sweeps, jobs, letters, workers, pauses, portfolios ---------------------------
# Each page scopes its querysets with ``retention.scoping`` like the pages
# above (an object outside the user's portfolios is a 404) and issues a fixed
# number of queries (``console_selectors``).

SWEEPS_PAGE_SIZE = 20


@login_required
@permission_required("cleanup_ops.view_sweep", raise_exception=True)
def sweeps_list(request: HttpRequest) -> HttpResponse:
    """History of sweeps (slot, status, duration, jobs, rows, outcomes, dead
    letters) and the drain forecast of the ones still running."""
    scope = visible_portfolio_ids(request.user)
    now = timezone.now()
    page = Paginator(Sweep.objects.order_by("-slot"), SWEEPS_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = sweeps_history(list(page), now=now, portfolio_ids=scope)
    for row in rows:
        row["forecast"] = (
            drain_forecast(
                now=now,
                started_at=row["sweep"].admitted_at or row["sweep"].created_at,
                remaining=row["open"],
                finished_recently=row["finished_recently"],
                next_slot=next_slot_after(row["sweep"].slot),
            )
            if row["running"]
            else None
        )
    return render_live(request, "console/sweeps.html", {"page": page, "rows": rows})


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def jobs_list(request: HttpRequest) -> HttpResponse:
    """Jobs, newest first, filtered by sweep, state, portfolio, record kind,
    failure category and job kind; ``before`` pages back by id."""
    scope = visible_portfolio_ids(request.user)
    job_filter = job_filter_parse(request.GET, strict=False)
    before = id_param(request.GET, "before", strict=False)
    result = jobs_page(job_filter, portfolio_ids=scope, before=before)
    return render_live(
        request,
        "console/jobs.html",
        {
            "result": result,
            "filters": job_filter.as_params(),
            "names": portfolio_names(job.portfolio_id for job in result.jobs),
            "portfolios": portfolio_choices(portfolio_ids=scope),
            "sweeps": list(Sweep.objects.order_by("-slot").values("id", "key")[:30]),
            "states": JobState.choices,
            "kinds": RECORD_KIND_CHOICES,
            "categories": FailureCategory.choices,
            "job_kinds": JobKind.choices,
        },
    )


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: state, attempts and failure category, cursor, lease holder and
    expiry, its ledger operations, its dead letter and its redrives."""
    jobs = CleanupJob.objects.select_related("sweep", "policy_version", "policy_version__policy")
    job = get_object_or_404(scope_queryset(jobs, request.user), pk=job_id)
    detail = job_detail(job, scope_audit=lambda qs: scope_audit_events(qs, request.user))
    now = timezone.now()
    return render_live(
        request,
        "console/job.html",
        {
            "job": job,
            **detail,
            "names": portfolio_names([job.portfolio_id]),
            "live_lease": job.has_live_lease(now=now),
            "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
            "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
        },
    )


@login_required
@permission_required("cleanup_ops.view_deadletter", raise_exception=True)
def dead_letter_page(request: HttpRequest, letter_id: int) -> HttpResponse:
    """One dead letter: why it stopped, its job, sweep and portfolio, who
    decided what (its audit events), and redrive or dismiss with a reason."""
    letters = DeadLetter.objects.select_related("job", "sweep", "resolved_by", "redrive_job")
    letter = get_object_or_404(scope_queryset(letters, request.user), pk=letter_id)
    events = scope_audit_events(
        AuditEvent.objects.filter(object_type="dead_letter", object_id=str(letter.pk)).select_related("actor"),
        request.user,
    )
    return render(
        request,
        "console/dead_letter.html",
        {
            "letter": letter,
            "events": list(events.order_by("id")[:50]),
            "names": portfolio_names([letter.portfolio_id]),
            "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
            "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
        },
    )


BULK_BREAKDOWN_ROWS = 20


@login_required
@require_http_methods(["GET", "POST"])
def dead_letters_bulk(request: HttpRequest) -> HttpResponse:
    """Redrive or dismiss *every* open letter matching the inbox's filter.

    GET shows the count, a breakdown and asks for a reason; POST with
    ``confirm=yes`` applies ``dead_letters_decide`` with the same
    ``DeadLetterFilter``. If the number matching changed since the page was
    shown (``expected``), nothing happens and the page asks again."""
    params = request.POST if request.method == "POST" else request.GET
    operation = params.get("operation")
    if operation not in {Decision.REDRIVE, Decision.DISMISS}:
        return HttpResponse("operation must be redrive or dismiss", status=400)
    if not request.user.has_perm(f"cleanup_ops.{operation}_deadletter"):
        raise PermissionDenied
    parsed = dead_letter_filter_parse(params, strict=False)
    letter_filter = replace(parsed, status=DeadLetter.Status.OPEN, letter_ids=None)
    matching = scope_queryset(dead_letters(letter_filter), request.user)
    count = matching.count()
    reason = params.get("reason", "")
    errors: list[str] = []
    if request.method == "POST" and params.get("confirm") == "yes":
        expected = id_param(params, "expected", strict=False)
        if len(reason.strip()) < MIN_REASON_LENGTH:
            errors.append(
                f"A reason of at least {MIN_REASON_LENGTH} characters is required; it goes into the audit trail."
            )
        elif count == 0:
            errors.append("No open dead letter matches this filter any more.")
        elif expected != count:
            errors.append(
                f"The number of open letters matching changed from {expected} to {count}; check and confirm again."
            )
        else:
            if visible_portfolio_ids(request.user) is not None:
                # Never act beyond the user's portfolios: pin the letters seen.
                letter_filter = replace(letter_filter, letter_ids=tuple(matching.values_list("id", flat=True)))
            return _bulk_apply(request, operation, letter_filter, reason)
    breakdown = list(
        matching.order_by()
        .values("category", "portfolio_id")
        .annotate(n=Count("id"))
        .order_by("-n", "category", "portfolio_id")[:BULK_BREAKDOWN_ROWS]
    )
    return render(
        request,
        "console/dead_letters_bulk.html",
        {
            "operation": operation,
            "count": count,
            "reason": reason,
            "errors": errors,
            "filters": {k: v for k, v in letter_filter.as_params().items() if k != "status"},
            "breakdown": breakdown,
            "breakdown_more": len(breakdown) == BULK_BREAKDOWN_ROWS,
            "names": portfolio_names([row["portfolio_id"] for row in breakdown] + [letter_filter.portfolio_id]),
        },
        status=400 if errors else 200,
    )


def _bulk_apply(request: HttpRequest, operation: str, letter_filter: DeadLetterFilter, reason: str) -> HttpResponse:
    inbox = (
        reverse("console:dead_letters")
        + "?"
        + urlencode({k: v for k, v in letter_filter.as_params().items() if k != "status"})
    )
    try:
        if operation == Decision.REDRIVE:
            result = dead_letters_redrive_bulk(actor=request.user, reason=reason, letter_filter=letter_filter)
            messages.success(request, f"Redrove {len(result)} dead letter(s) matching the filter.")
            failed = getattr(result, "failed", [])
            if failed:
                listed = ", ".join(f"{failure.letter_id} ({failure.error_class})" for failure in failed)
                messages.error(request, f"{len(failed)} letter(s) could not be redriven and are still open: {listed}.")
        else:
            n = dead_letters_dismiss_bulk(actor=request.user, reason=reason, letter_filter=letter_filter)
            messages.success(request, f"Dismissed {n} dead letter(s) matching the filter.")
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    return HttpResponseRedirect(inbox)


@login_required
@permission_required("cleanup_ops.view_workerheartbeat", raise_exception=True)
def workers_page(request: HttpRequest) -> HttpResponse:
    """Worker clusters (heartbeats, last progress, liveness), the leases each
    worker holds and expired leases waiting to be recovered; the broker's
    queues (messages waiting, through django-q2's broker interface)."""
    return render_live(
        request, "console/workers.html", {"w": workers_overview(now=timezone.now()), "broker": broker_status()}
    )


@login_required
@permission_required("cleanup_ops.view_pipelinepause", raise_exception=True)
def pauses_page(request: HttpRequest) -> HttpResponse:
    """Active pauses (pipeline and portfolios) with resume, recent ones, and
    a form to pause the pipeline or a portfolio chosen by name."""
    scope = visible_portfolio_ids(request.user)
    pauses = pauses_overview(portfolio_ids=scope)
    choices = portfolio_choices(portfolio_ids=scope)
    paused_ids = {p.portfolio_id for p in pauses["active"] if p.portfolio_id is not None}
    ids = [p.portfolio_id for p in [*pauses["active"], *pauses["history"]]]
    return render(
        request,
        "console/pauses.html",
        {
            **pauses,
            "portfolios": [c for c in choices if c["id"] not in paused_ids],
            "names": {c["id"]: c["name"] for c in choices} | portfolio_names(i for i in ids if i not in paused_ids),
            "can_pause": request.user.has_perm("cleanup_ops.add_pipelinepause"),
            "can_resume": request.user.has_perm("cleanup_ops.change_pipelinepause"),
            "min_reason": MIN_REASON_LENGTH,
        },
    )


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def portfolio_page(request: HttpRequest, portfolio_id: int) -> HttpResponse:
    """One portfolio's pipeline: open jobs, current sweep, dead letters, rows
    deleted, its pause (with pause or resume), and its audit events."""
    portfolio = get_object_or_404(portfolios_visible_to(request.user), pk=portfolio_id)
    summary = portfolio_summary(portfolio.pk, now=timezone.now())
    return render_live(
        request,
        "console/portfolio.html",
        {
            "portfolio": portfolio,
            "s": summary,
            "can_pause": request.user.has_perm("cleanup_ops.add_pipelinepause"),
            "can_resume": request.user.has_perm("cleanup_ops.change_pipelinepause"),
            "min_reason": MIN_REASON_LENGTH,
        },
    )


# A request that carries any of these came through a proxy: its REMOTE_ADDR is
# the proxy's (loopback when it runs on the same host), not the client's.
FORWARDING_HEADERS = (
    "HTTP_FORWARDED",
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_REAL_IP",
    "HTTP_X_FORWARDED_HOST",
    "HTTP_X_CLIENT_IP",
    "HTTP_TRUE_CLIENT_IP",
    "HTTP_CF_CONNECTING_IP",
)


def metrics_allowed(request: HttpRequest) -> bool:
    """The bearer token, or a direct (unproxied) connection from ``METRICS_ALLOWED_IPS``.

    Behind a reverse proxy on the same host every request arrives from
    loopback, so an address is trusted only when no forwarding header is
    present; a proxied scrape must send the token. Bytes are compared, so a
    non-ASCII header is a mismatch rather than a ``TypeError``.
    """
    token = settings.METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        if hmac.compare_digest(header.encode("utf-8", "surrogatepass"), f"Bearer {token}".encode()):
            return True
    if any(name in request.META for name in FORWARDING_HEADERS):
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
