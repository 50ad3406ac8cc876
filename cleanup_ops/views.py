"""Operator console: server-rendered pages, login required, role-aware.

Every page issues a fixed number of queries whatever the data size (the
figures come from aggregate selectors; lists are paginated). Writes go through
services, need a reason, and leave audit events; the dead-letter actions add a
confirmation step before anything changes.

A customer's staff see only the portfolios where their role grants the
permission a page requires (``retention.scoping.portfolio_ids_where`` with
that permission — not every portfolio they are a member of): every figure,
list and export below is narrowed with it; sweeps themselves are the
platform's schedule and visible to every role that reaches them, with the
customer's own figures.

Bad input: filters and ids are parsed strictly (``retention.filters``,
``retention.inputs``); an invalid one answers 400 naming the parameter
(``console/bad_request.html``) and changes nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from functools import wraps
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
    dead_letters_decide,
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
from retention.filters import FilterError, audit_events, audit_filter_parse, id_param, int_param
from retention.inputs import MAX_ID, MAX_TEXT_LENGTH, InputError, id_check, text_check
from retention.models import AuditEvent
from retention.registry import RECORD_KIND_CHOICES
from retention.scoping import (
    may_act_in,
    portfolio_ids_q,
    portfolio_ids_where,
    portfolios_where,
    scope_audit_events,
    scope_queryset,
)

VIEW_PERM = "cleanup_ops.view_cleanupjob"
LETTER_VIEW = "cleanup_ops.view_deadletter"
SWEEP_VIEW = "cleanup_ops.view_sweep"
PAUSE_VIEW = "cleanup_ops.view_pipelinepause"
PAGE_SIZE = 50


def bad_request(request: HttpRequest, field: str, message: str) -> HttpResponse:
    """400 naming the parameter; nothing was changed."""
    back = request.path if request.method == "GET" else reverse("console:overview")
    context = {"field": field, "message": message, "back": back}
    return render(request, "console/bad_request.html", context, status=400)


def bad_input_as_400(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A ``FilterError`` or ``InputError`` raised while a page reads its
    parameters becomes a 400 naming the parameter."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (FilterError, InputError) as exc:
            return bad_request(request, exc.field, exc.message)

    return wrapped


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
    if raw in (None, ""):
        return THROUGHPUT_HOURS
    if raw not in {str(h) for h in CHART_HOURS}:
        raise FilterError("hours", f"hours must be one of {', '.join(map(str, CHART_HOURS))}.")
    return int(raw)


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
@bad_input_as_400
def overview_page(request: HttpRequest) -> HttpResponse:
    scope = portfolio_ids_where(request.user, VIEW_PERM)
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
    scope = portfolio_ids_where(request.user, VIEW_PERM)
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
    scope = portfolio_ids_where(request.user, VIEW_PERM)
    proof = sweep_proof(sweep=get_object_or_404(Sweep, pk=sweep_id), portfolio_ids=scope)
    if fmt == "csv":
        response = HttpResponse(proof_csv(proof), content_type="text/csv")
    else:
        response = JsonResponse(proof)
    response["Content-Disposition"] = f'attachment; filename="proof-{proof["key"].replace(":", "_")}.{fmt}"'
    return response


@login_required
@permission_required(LETTER_VIEW, raise_exception=True)
@bad_input_as_400
def dead_letter_inbox(request: HttpRequest) -> HttpResponse:
    letter_filter = dead_letter_filter_parse(request.GET, strict=True, default_status=DeadLetter.Status.OPEN)
    letters = scope_queryset(dead_letters(letter_filter), request.user, perm=LETTER_VIEW)
    page = Paginator(letters, PAGE_SIZE).get_page(request.GET.get("page"))
    return render_live(
        request,
        "console/dead_letters.html",
        {
            "page": page,
            "names": portfolio_names(letter.portfolio_id for letter in page),
            "portfolios": portfolio_choices(portfolio_ids=portfolio_ids_where(request.user, LETTER_VIEW)),
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
@bad_input_as_400
def dead_letter_action(request: HttpRequest) -> HttpResponse:
    """Step 1 (no ``confirm``): validate and show a confirmation page. Step 2: apply."""
    operation = request.POST.get("operation")
    if operation not in {"redrive", "dismiss"}:
        return bad_request(request, "operation", "operation must be redrive or dismiss.")
    perm = f"cleanup_ops.{operation}_deadletter"
    if not request.user.has_perm(perm):
        raise PermissionDenied
    # Every id must be one (1 to 19 digits, at most 2^63-1): "²" or a
    # 5000-digit number is a 400 naming the field, never a 500.
    ids = [id_check(i, field="letter", from_form=True) for i in request.POST.getlist("letter")]
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    letters = list(scope_queryset(DeadLetter.objects.filter(pk__in=ids), request.user, perm=perm).order_by("id"))
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
    try:
        decided, jobs, failed = dead_letters_decide(
            decision=Decision(operation),
            actor=request.user,
            reason=reason,
            letter_filter=DeadLetterFilter(letter_ids=tuple(letter.pk for letter in letters)),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect_back(request, "console:dead_letters")
    if operation == "redrive":
        new_ids = ", ".join(str(job.pk) for job in jobs)
        messages.success(request, f"Redrove {len(jobs)} dead letter(s): new job(s) {new_ids or 'none'}.")
    else:
        messages.success(request, f"Dismissed {len(decided)} dead letter(s).")
    _report_failures(request, operation, failed)
    skipped = len(letters) - len(failed) - len(decided)
    if skipped:
        messages.warning(request, f"{skipped} letter(s) were no longer open and were left as they are.")
    return redirect_back(request, "console:dead_letters")


@login_required
@permission_required("retention.view_auditevent", raise_exception=True)
@bad_input_as_400
def audit_log(request: HttpRequest) -> HttpResponse:
    audit_filter = audit_filter_parse(request.GET, strict=True)
    events = scope_audit_events(audit_events(audit_filter), request.user)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    named = [e.details.get("portfolio_id") for e in page if isinstance(e.details, dict)]
    named += [int(e.object_id) for e in page if e.object_type == "portfolio" and e.object_id.isdigit()]
    names = portfolio_names(i for i in named if isinstance(i, int))
    return render(request, "console/audit.html", {"page": page, "filters": audit_filter.as_params(), "names": names})


@login_required
@require_http_methods(["POST"])
@bad_input_as_400
def pause_toggle(request: HttpRequest) -> HttpResponse:
    """Pause or resume the pipeline or one portfolio (``portfolio``: its id,
    from a select of portfolio names), with a reason; back to ``next``.

    A malformed id or reason (too long, control characters) is a 400 naming
    the field; a refusal of the service (a short reason, not paused) comes
    back as a message on the page."""
    resume = request.POST.get("operation") == "resume"
    portfolio = request.POST.get("portfolio") or None
    portfolio_id = id_check(portfolio, field="portfolio", from_form=True) if portfolio else None
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    perm = "cleanup_ops.change_pipelinepause" if resume else "cleanup_ops.add_pipelinepause"
    try:
        held = portfolio_id is not None and request.user.has_perm(perm)
        if held and not may_act_in(request.user, perm, portfolio_id):
            # Where the user does not hold the role: the answer for a portfolio that does not exist.
            raise ValidationError({"portfolio": f"no portfolio with id {portfolio_id}"})
        fn = pipeline_resume if resume else pipeline_pause
        fn(actor=request.user, reason=reason, portfolio_id=portfolio_id)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
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
    scope = portfolio_ids_where(request.user, SWEEP_VIEW)
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
@bad_input_as_400
def jobs_list(request: HttpRequest) -> HttpResponse:
    """Jobs, newest first, filtered by sweep, state, portfolio, record kind,
    failure category and job kind; ``before`` pages back by id."""
    scope = portfolio_ids_where(request.user, VIEW_PERM)
    job_filter = job_filter_parse(request.GET, strict=True)
    before = id_param(request.GET, "before", strict=True)
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
    job = get_object_or_404(scope_queryset(jobs, request.user, perm=VIEW_PERM), pk=job_id)
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
@permission_required(LETTER_VIEW, raise_exception=True)
def dead_letter_page(request: HttpRequest, letter_id: int) -> HttpResponse:
    """One dead letter: why it stopped, its job, sweep and portfolio, who
    decided what (its audit events), and redrive or dismiss with a reason."""
    letters = DeadLetter.objects.select_related("job", "sweep", "resolved_by", "redrive_job")
    letter = get_object_or_404(scope_queryset(letters, request.user, perm=LETTER_VIEW), pk=letter_id)
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
@bad_input_as_400
def dead_letters_bulk(request: HttpRequest) -> HttpResponse:
    """Redrive or dismiss *every* open letter matching the inbox's filter.

    GET shows the count, a breakdown and asks for a reason; POST with
    ``confirm=yes`` applies ``dead_letters_decide`` with the same
    ``DeadLetterFilter``. If the number matching changed since the page was
    shown (``expected``), nothing happens and the page asks again."""
    params = request.POST if request.method == "POST" else request.GET
    operation = params.get("operation")
    if operation not in {Decision.REDRIVE, Decision.DISMISS}:
        return bad_request(request, "operation", "operation must be redrive or dismiss.")
    perm = f"cleanup_ops.{operation}_deadletter"
    if not request.user.has_perm(perm):
        raise PermissionDenied
    parsed = dead_letter_filter_parse(params, strict=True)
    letter_filter = replace(parsed, status=DeadLetter.Status.OPEN, letter_ids=None)
    matching = scope_queryset(dead_letters(letter_filter), request.user, perm=perm)
    count = matching.count()
    reason = text_check(params.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    errors: list[str] = []
    if request.method == "POST" and params.get("confirm") == "yes":
        expected = int_param(params, "expected", strict=True, minimum=0, maximum=MAX_ID)
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
            if portfolio_ids_where(request.user, perm) is not None:
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
            _report_failures(request, operation, result.failed)
        else:
            decided, _, failed = dead_letters_decide(
                decision=Decision.DISMISS, actor=request.user, reason=reason, letter_filter=letter_filter
            )
            messages.success(request, f"Dismissed {len(decided)} dead letter(s) matching the filter.")
            _report_failures(request, operation, failed)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    return HttpResponseRedirect(inbox)


def _report_failures(request: HttpRequest, operation: str, failed: list[Any]) -> None:
    """Letters a decision could not apply (a database error): still open, named
    with the error's class — never reported as "no longer open"."""
    if failed:
        listed = ", ".join(failure.describe() for failure in failed)
        verb = "redriven" if operation == Decision.REDRIVE else "dismissed"
        messages.error(request, f"{len(failed)} letter(s) could not be {verb} and are still open: {listed}.")


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
@permission_required(PAUSE_VIEW, raise_exception=True)
def pauses_page(request: HttpRequest) -> HttpResponse:
    """Active pauses (pipeline and portfolios) with resume, recent ones, and
    a form to pause the pipeline or a portfolio chosen by name."""
    scope = portfolio_ids_where(request.user, PAUSE_VIEW)
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
    portfolio = get_object_or_404(portfolios_where(request.user, VIEW_PERM), pk=portfolio_id)
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
