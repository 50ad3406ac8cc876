"""Jobs: the filtered list and one job."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone

from cleanup_ops.console_selectors import (
    job_detail,
    job_filter_parse,
    jobs_page,
    portfolio_choices,
    portfolio_names,
)
from cleanup_ops.models import CleanupJob, JobKind, JobState, Sweep
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.views.common import (
    VIEW_PERM,
    bad_input_as_400,
    render_live,
)
from retention.filters import id_param
from retention.registry import RECORD_KIND_CHOICES
from retention.scoping import (
    portfolio_ids_where,
    scope_audit_events,
    scope_queryset,
)


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
