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
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.proof import PROOF_FORMATS, proof_csv, sweep_proof
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import (
    MIN_REASON_LENGTH,
    dead_letters_dismiss_bulk,
    dead_letters_redrive_bulk,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.selectors import (
    DeadLetterFilter,
    dead_letter_filter_parse,
    dead_letters,
    overview,
    sweep_figures_seen,
    sweeps_seen,
)
from retention.filters import audit_events, audit_filter_parse
from retention.scoping import portfolio_ids_q, scope_audit_events, scope_queryset, visible_portfolio_ids

VIEW_PERM = "cleanup_ops.view_cleanupjob"
PAGE_SIZE = 50


def bar_chart(points: list[tuple[str, int]], *, width: int = 480, height: int = 120) -> dict[str, Any]:
    """Geometry for a server-rendered SVG bar chart (no JavaScript, no library)."""
    top = max((v for _, v in points), default=0) or 1
    step = width / max(len(points), 1)
    bars = []
    for i, (label, value) in enumerate(points):
        h = round((height - 20) * value / top, 1)
        bars.append(
            {
                "x": round(i * step + 2, 1),
                "y": round(height - 16 - h, 1),
                "w": round(step - 4, 1),
                "h": h,
                "label": label,
                "value": value,
                "tx": round(i * step + step / 2, 1),
            }
        )
    return {"width": width, "height": height, "bars": bars, "max": top}


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def overview_page(request: HttpRequest) -> HttpResponse:
    figures = overview(portfolio_ids=visible_portfolio_ids(request.user))
    throughput_chart = bar_chart([(p["hour"][11:13] + "h", p["rows"]) for p in figures["throughput"]])
    retries_chart = bar_chart(list(figures["retries_by_category"].items()), height=120)
    return render(
        request,
        "console/overview.html",
        {
            "f": figures,
            "throughput_chart": throughput_chart,
            "retries_chart": retries_chart,
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
    return render(
        request, "console/sweep.html", {"sweep": sweep, "figures": figures, "outcomes": outcomes, "letters": letters}
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
    return render(
        request,
        "console/dead_letters.html",
        {
            "page": page,
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
            {"operation": operation, "letters": letters, "reason": reason, "errors": errors},
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
        return HttpResponseRedirect(reverse("console:dead_letters"))
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
    return HttpResponseRedirect(reverse("console:dead_letters"))


@login_required
@permission_required("retention.view_auditevent", raise_exception=True)
def audit_log(request: HttpRequest) -> HttpResponse:
    audit_filter = audit_filter_parse(request.GET, strict=False)
    events = scope_audit_events(audit_events(audit_filter), request.user)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "console/audit.html", {"page": page, "filters": audit_filter.as_params()})


@login_required
@require_http_methods(["POST"])
def pause_toggle(request: HttpRequest) -> HttpResponse:
    resume = request.POST.get("operation") == "resume"
    portfolio = request.POST.get("portfolio") or None
    try:
        fn = pipeline_resume if resume else pipeline_pause
        fn(
            actor=request.user,
            reason=request.POST.get("reason", ""),
            portfolio_id=int(portfolio) if portfolio else None,
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    except ValueError:
        messages.error(request, "portfolio must be an id")
    else:
        messages.success(request, "Resumed." if resume else "Paused.")
    return HttpResponseRedirect(reverse("console:overview"))


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
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
