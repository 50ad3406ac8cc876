"""Jobs: the filtered list, one job, and the actions on jobs — run now and
cancel, for one job (its page) or for every job matching the list's filter
(with a count to confirm, like the dead letters' bulk decisions)."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from cleanup_ops.console_selectors import (
    JobFilter,
    job_detail,
    job_filter_parse,
    jobs_mark_paused,
    portfolio_choices,
    portfolio_names,
    property_names,
)
from cleanup_ops.console_selectors.exports import JOB_EXPORT_COLUMNS, export_rows
from cleanup_ops.console_selectors.jobs import JOB_SORTS, jobs_listed
from cleanup_ops.console_selectors.paging import keyset_page, page_size_parse, sort_parse
from cleanup_ops.console_selectors.waiting import open_work, why_they_will_not_run
from cleanup_ops.models import CleanupJob, JobKind, JobState, Sweep
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import (
    JOB_ACTION_PERMISSION,
    MIN_REASON_LENGTH,
    JobAction,
    JobsActed,
    jobs_act,
    jobs_in_reach,
)
from cleanup_ops.views.common import (
    PAGE_SIZE,
    VIEW_PERM,
    bad_input_as_400,
    bad_request,
    counted,
    csv_stream,
    holds_context,
    live_kinds_now,
    per_page_context,
    per_page_param,
    reason_problem,
    render_live,
    start_commands,
    were,
)
from cleanup_ops.views.confirm import BULK_BREAKDOWN_ROWS, bulk_confirmation
from retention.actors import request_actor
from retention.inputs import MAX_TEXT_LENGTH, text_check
from retention.registry import record_kind_choices
from retention.scoping import portfolio_ids_q, portfolio_ids_where, scope_audit_events, scope_queryset


def _may(request: HttpRequest, action: JobAction) -> bool:
    return request.user.has_perm(JOB_ACTION_PERMISSION[action])


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
@bad_input_as_400
def jobs_list(request: HttpRequest) -> HttpResponse:
    """Jobs, newest first unless sorted by a column (``sort``), filtered by
    sweep, state, portfolio, record kind, failure category, job kind and free
    text (``q``); paged both ways with the position (``console_selectors.paging``)."""
    scope = portfolio_ids_where(request.user, VIEW_PERM)
    job_filter = job_filter_parse(request.GET, strict=True)
    sort = sort_parse(request.GET, JOB_SORTS, default="-id")
    size = page_size_parse(request.GET, default=PAGE_SIZE)
    result = keyset_page(jobs_listed(job_filter, portfolio_ids=scope), request.GET, sort=sort, size=size)
    jobs_mark_paused(result.rows)
    return render_live(
        request,
        "console/jobs.html",
        {
            "result": result,
            "filters": job_filter.as_params() | {"sort": sort.param} | per_page_param(size),
            "names": portfolio_names(job.portfolio_id for job in result.rows),
            "property_names": property_names(job.property_id for job in result.rows),
            "portfolios": portfolio_choices(portfolio_ids=scope),
            "sweeps": list(Sweep.objects.order_by("-slot").values("id", "key")[:30]),
            "states": JobState.choices,
            "kinds": record_kind_choices(),
            "categories": FailureCategory.choices,
            "job_kinds": JobKind.choices,
            "can_run_now": _may(request, JobAction.RUN_NOW),
            "can_cancel": _may(request, JobAction.CANCEL),
            "min_reason": MIN_REASON_LENGTH,
            **per_page_context(size),
        },
    )


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
@bad_input_as_400
def jobs_export(request: HttpRequest) -> HttpResponseBase:
    """The jobs list as CSV: the page's filter, scope and sort, every row
    (not one page), identifiers, states, counts and times only."""
    scope = portfolio_ids_where(request.user, VIEW_PERM)
    job_filter = job_filter_parse(request.GET, strict=True)
    sort = sort_parse(request.GET, JOB_SORTS, default="-id")
    listed = CleanupJob.objects.filter(job_filter.q(), portfolio_ids_q(scope))
    return csv_stream(export_rows(listed, sort=sort, columns=JOB_EXPORT_COLUMNS), filename="jobs.csv")


def _job_context(request: HttpRequest, job: CleanupJob) -> dict[str, object]:
    detail = job_detail(job, scope_audit=lambda qs: scope_audit_events(qs, request.user))
    jobs_mark_paused([job])
    return {
        "job": job,
        **detail,
        "names": portfolio_names([job.portfolio_id]),
        "property_names": property_names([job.property_id]),
        "live_lease": job.has_live_lease(now=timezone.now()),
        "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
        "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
        "can_run_now": _may(request, JobAction.RUN_NOW),
        "can_cancel": _may(request, JobAction.CANCEL),
        "min_reason": MIN_REASON_LENGTH,
        **holds_context(request, portfolio_id=job.portfolio_id, partition=(job.property_id, job.record_kind)),
    }


def _visible_jobs(request: HttpRequest) -> QuerySet[CleanupJob]:
    jobs = CleanupJob.objects.select_related("sweep", "policy_version", "policy_version__policy", "purge_request")
    return scope_queryset(jobs, request.user, perm=VIEW_PERM)


@login_required
@permission_required(VIEW_PERM, raise_exception=True)
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: state, attempts and failure category, cursor (a delete) or
    its attachments (a purge), lease holder and expiry, its ledger
    operations, its dead letter and its redrives; run now or cancel it."""
    job = get_object_or_404(_visible_jobs(request), pk=job_id)
    return render_live(request, "console/job.html", _job_context(request, job))


def _parse_action(raw: str | None) -> JobAction:
    if raw not in JobAction.values:
        raise _BadAction
    return JobAction(raw)


class _BadAction(Exception):
    pass


@login_required
@require_POST
@bad_input_as_400
def job_action(request: HttpRequest, job_id: int) -> HttpResponse:
    """Run now or cancel one job, with a reason. A reason too short answers
    400 with the job's page and the reason kept; a job no longer pending is
    left as it is and says so."""
    try:
        action = _parse_action(request.POST.get("operation"))
    except _BadAction:
        return bad_request(request, "operation", "operation must be run_now or cancel.")
    if not _may(request, action):
        raise PermissionDenied
    job = get_object_or_404(_visible_jobs(request), pk=job_id)
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    problem = reason_problem(reason)
    if not jobs_in_reach(action=action, actor=request_actor(request), job_filter=JobFilter(job_ids=(job.pk,))).exists():
        if job.state == JobState.PENDING:
            raise PermissionDenied  # visible, but the action's role is not held in this portfolio
        state = job.get_state_display().lower()
        problem = problem or f"Job {job.pk} is {state}, not pending: nothing to {action.label.lower()}."
    if problem:
        context = _job_context(request, job) | {"action_error": problem, "action": action, "reason": reason}
        return render_live(request, "console/job.html", context, status=400)
    try:
        done = jobs_act(
            action=action, actor=request_actor(request), reason=reason, job_filter=JobFilter(job_ids=(job.pk,))
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        _report(request, action, done)
    return HttpResponseRedirect(reverse("console:job", args=[job.pk]))


def _report(request: HttpRequest, action: JobAction, done: JobsActed) -> None:
    if action == JobAction.RUN_NOW:
        _report_run_now(request, done)
    else:
        messages.success(
            request,
            f"Cancelled {counted(len(done), 'job')}: {'it is' if len(done) == 1 else 'each is'} a dead letter"
            " of category cancelled, which can be redriven.",
        )
    if done.skipped:
        messages.warning(
            request,
            f"{counted(done.skipped, 'job')} "
            + (
                "was no longer pending and was left as it is."
                if done.skipped == 1
                else "were no longer pending and were left as they are."
            ),
        )


def _report_run_now(request: HttpRequest, done: JobsActed) -> None:
    """Due now — and whether anything will take them: a paused portfolio's
    jobs wait for a resume, and jobs whose queue has no live cluster wait for
    one (the redrive's warnings, ``why_they_will_not_run``). Only the jobs
    nothing blocks are said to run "as soon as a worker takes them"."""
    now = timezone.now()
    work = open_work(now=now, portfolio_ids=None, live_kinds=live_kinds_now(now), job_ids=list(done.jobs))
    warnings = why_they_will_not_run(
        work, stale_seconds=settings.CLEANUP_LIVENESS_STALE_SECONDS, start_commands=start_commands()
    )
    if not warnings:
        messages.success(
            request,
            f"{counted(len(done), 'job')} {were(len(done), 'is', 'are')} due now;"
            f" {were(len(done), 'it runs', 'they run')} as soon as a worker takes {were(len(done), 'it', 'them')}.",
        )
        return
    tail = (
        f" {work.runnable} of them {were(work.runnable, 'runs', 'run')} as soon as a worker takes them."
        if work.runnable > 0
        else ""
    )
    messages.success(request, f"{counted(len(done), 'job')} {were(len(done), 'is', 'are')} due now.{tail}")
    for warning in warnings:
        messages.warning(request, warning)


@login_required
@require_http_methods(["GET", "POST"])
@bad_input_as_400
def jobs_bulk(request: HttpRequest) -> HttpResponse:
    """Run now or cancel *every* pending job matching the jobs list's filter.

    GET shows the count, a breakdown and asks for a reason; POST with
    ``confirm=yes`` and the count shown (``expected``) applies ``jobs_act``.
    If the jobs matching are not the ones shown (their number, or their ids:
    ``seen``, ``cleanup_ops.views.confirm``), nothing happens and the page asks again."""
    params = request.POST if request.method == "POST" else request.GET
    try:
        action = _parse_action(params.get("operation"))
    except _BadAction:
        return bad_request(request, "operation", "operation must be run_now or cancel.")
    if not _may(request, action):
        raise PermissionDenied
    job_filter = replace(job_filter_parse(params, strict=True), state=None, job_ids=None)
    matching = jobs_in_reach(action=action, actor=request_actor(request), job_filter=job_filter)
    page = bulk_confirmation(
        method=request.method or "GET",
        params=params,
        matching=matching,
        noun="pending jobs",
        none_left="No pending job matches this filter any more.",
    )
    if page.pinned is not None:
        # The jobs seen are the jobs acted on: pinned by id.
        pinned = replace(job_filter, job_ids=page.pinned)
        try:
            done = jobs_act(action=action, actor=request_actor(request), reason=page.reason, job_filter=pinned)
            _report(request, action, done)
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
        return HttpResponseRedirect(reverse("console:jobs") + "?" + _params(job_filter))
    breakdown = list(
        matching.order_by()
        .values("portfolio_id", "job_kind")
        .annotate(n=Count("id"))
        .order_by("-n", "portfolio_id", "job_kind")[:BULK_BREAKDOWN_ROWS]
    )
    return render(
        request,
        "console/jobs_bulk.html",
        {
            **page.context(breakdown=breakdown),
            "action": action,
            "filters": job_filter.as_params(),
            "names": portfolio_names([row["portfolio_id"] for row in breakdown] + [job_filter.portfolio_id]),
        },
        status=400 if page.errors else 200,
    )


def _params(job_filter: JobFilter) -> str:
    return urlencode(job_filter.as_params())
