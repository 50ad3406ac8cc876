"""Run now or cancel the jobs ticked on the jobs list ("select all" ticks a
whole page). Beside the per-job action and the all-matching bulk action
(``views.jobs``), with the same rules: a reason, a confirmation page listing
exactly the jobs to be changed, then ``jobs_act`` with those ids pinned; a
job no longer pending when confirmed is left as it is and counted.

Only pending jobs in portfolios where the user holds the action's role are
listed; another ticked id (another customer's, or one that does not exist)
is dropped silently, exactly like an id that does not exist.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from cleanup_ops.console_selectors import JobFilter, portfolio_names, property_names
from cleanup_ops.recovery.operator import (
    JOB_ACTION_PERMISSION,
    MIN_REASON_LENGTH,
    JobAction,
    jobs_act,
    jobs_in_reach,
)
from cleanup_ops.views.common import bad_input_as_400, bad_request, counted, reason_problem, redirect_back
from retention.actors import request_actor
from retention.inputs import MAX_TEXT_LENGTH, id_check, text_check

# One page's worth, and then some: the list shows 50 jobs a page.
MAX_SELECTED = 500


@login_required
@require_POST
@bad_input_as_400
def jobs_selected(request: HttpRequest) -> HttpResponse:
    raw = request.POST.get("operation")
    if raw not in JobAction.values:
        return bad_request(request, "operation", "operation must be run_now or cancel.")
    action = JobAction(raw)
    if not request.user.has_perm(JOB_ACTION_PERMISSION[action]):
        raise PermissionDenied
    ticked = request.POST.getlist("job")
    if len(ticked) > MAX_SELECTED:
        return bad_request(request, "job", f"At most {MAX_SELECTED} jobs can be ticked at once.")
    ids = tuple(sorted({id_check(i, field="job", from_form=True) for i in ticked}))
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    pinned = JobFilter(job_ids=ids)
    jobs = list(jobs_in_reach(action=action, actor=request_actor(request), job_filter=pinned).order_by("id"))
    errors = [] if jobs else ["Tick at least one pending job."]
    if problem := reason_problem(reason):
        errors.append(problem)
    if errors or request.POST.get("confirm") != "yes":
        return render(
            request,
            "console/jobs_selected_confirm.html",
            {
                "action": action,
                "jobs": jobs,
                "reason": reason,
                "errors": errors,
                "next": request.POST.get("next", ""),
                "names": portfolio_names(job.portfolio_id for job in jobs),
                "property_names": property_names(job.property_id for job in jobs),
                "min_reason": MIN_REASON_LENGTH,
            },
            status=400 if errors else 200,
        )
    try:
        done = jobs_act(
            action=action,
            actor=request_actor(request),
            reason=reason,
            job_filter=JobFilter(job_ids=tuple(j.pk for j in jobs)),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        one = len(done) == 1
        if action == JobAction.RUN_NOW:
            verb = "is due now" if one else "are due now"
        else:
            verb = (
                "was cancelled (a dead letter now, which can be redriven)"
                if one
                else "were cancelled (each a dead letter now, which can be redriven)"
            )
        messages.success(request, f"{counted(len(done), 'ticked job')} {verb}.")
        if done.skipped:
            left = (
                "was no longer pending and is left as it is"
                if done.skipped == 1
                else "were no longer pending and are left as they are"
            )
            messages.warning(request, f"{counted(done.skipped, 'job')} {left}.")
    return redirect_back(request, "console:jobs")
