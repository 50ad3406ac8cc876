"""Pauses and portfolios: pause or resume the pipeline or one portfolio."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from cleanup_ops.console_selectors import (
    pauses_overview,
    portfolio_choices,
    portfolio_names,
    portfolio_summary,
)
from cleanup_ops.recovery.operator import (
    MIN_REASON_LENGTH,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.views.common import (
    PAUSE_VIEW,
    VIEW_PERM,
    bad_input_as_400,
    holds_context,
    redirect_back,
    render_live,
)
from retention.actors import request_actor
from retention.domain import portfolio_model
from retention.inputs import MAX_TEXT_LENGTH, key_check, key_or_none, text_check
from retention.scoping import (
    may_act_in,
    portfolio_ids_where,
    portfolios_where,
)


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
    portfolio_id = (
        key_check(portfolio, model=portfolio_model(), field="portfolio", from_form=True) if portfolio else None
    )
    reason = text_check(request.POST.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    perm = "cleanup_ops.change_pipelinepause" if resume else "cleanup_ops.add_pipelinepause"
    try:
        held = portfolio_id is not None and request.user.has_perm(perm)
        if held and portfolio_id is not None and not may_act_in(request.user, perm, portfolio_id):
            # Where the user does not hold the role: the answer for a portfolio that does not exist.
            raise ValidationError({"portfolio": f"no portfolio with id {portfolio_id}"})
        fn = pipeline_resume if resume else pipeline_pause
        fn(actor=request_actor(request), reason=reason, portfolio_id=portfolio_id)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        scope = "the whole pipeline"
        if portfolio_id is not None:
            scope = portfolio_names([portfolio_id]).get(portfolio_id, f"portfolio {portfolio_id}")
        messages.success(request, f"Resumed {scope}." if resume else f"Paused {scope}.")
    return redirect_back(request, "console:overview")


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
def portfolio_page(request: HttpRequest, portfolio_id: str) -> HttpResponse:
    """One portfolio's pipeline: open jobs, current sweep, dead letters, rows
    deleted, its pause (with pause or resume), and its audit events. The
    path's key is the customer model's (an integer, a UUID…); any other text
    is a 404, as a portfolio that does not exist."""
    key = key_or_none(portfolio_id, model=portfolio_model())
    if key is None:
        raise Http404("no such portfolio")
    portfolio = get_object_or_404(portfolios_where(request.user, VIEW_PERM), pk=key)
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
            **holds_context(request, portfolio_id=portfolio.pk),
        },
    )


# A request that carries any of these came through a proxy: its REMOTE_ADDR is
