"""Dead letters: the inbox, one letter, and the decision flow (redrive or
dismiss, for the ticked letters or for every letter matching a filter)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from cleanup_ops.console_selectors import (
    portfolio_choices,
    portfolio_names,
)
from cleanup_ops.models import DeadLetter
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import (
    MIN_REASON_LENGTH,
    Decision,
    dead_letters_decide,
    dead_letters_redrive_bulk,
)
from cleanup_ops.selectors import (
    DeadLetterFilter,
    dead_letter_filter_parse,
    dead_letters,
)
from cleanup_ops.views.common import (
    LETTER_VIEW,
    PAGE_SIZE,
    bad_input_as_400,
    bad_request,
    redirect_back,
    render_live,
)
from retention.filters import int_param
from retention.inputs import MAX_ID, MAX_TEXT_LENGTH, id_check, text_check
from retention.models import AuditEvent
from retention.scoping import (
    portfolio_ids_where,
    scope_audit_events,
    scope_queryset,
)


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
