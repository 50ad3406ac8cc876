"""Sweeps: the history with the running ones' forecasts, one sweep, its proof export."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone

from cleanup_ops.console_selectors import (
    portfolio_names,
    sweep_forecast,
    sweeps_history,
)
from cleanup_ops.console_selectors.paging import keyset_page, page_size_parse, sort_parse
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.proof import PROOF_FORMATS, proof_csv_sign, proof_sign, sweep_proof
from cleanup_ops.proof_keys import ProofKeyMissing
from cleanup_ops.selectors import (
    sweep_attachments,
    sweep_figures_seen,
    sweeps_seen,
)
from cleanup_ops.views.common import (
    PAGE_SIZE,
    SWEEP_VIEW,
    VIEW_PERM,
    bad_input_as_400,
    live_kinds_now,
    per_page_context,
    per_page_param,
    render_live,
)
from retention.scoping import (
    portfolio_ids_q,
    portfolio_ids_where,
)

SWEEPS_PAGE_SIZE = 20


def proof_name(sweep_key: str) -> str:
    """The proof export's file name, without its extension (the verify panel names it)."""
    return f"proof-{sweep_key.replace(':', '_')}"


# The sweeps list's sortable columns (``paging.sort_parse``): word → field.
SWEEP_SORTS = {"slot": "slot", "id": "id", "status": "status", "jobs": "jobs_admitted"}


@login_required
@permission_required("cleanup_ops.view_sweep", raise_exception=True)
@bad_input_as_400
def sweeps_list(request: HttpRequest) -> HttpResponse:
    """History of sweeps (slot, status, duration, jobs, rows, outcomes, dead
    letters) and the drain forecast of the ones still running; newest first
    unless sorted (``sort``), ``per_page`` at a time, paged both ways."""
    scope = portfolio_ids_where(request.user, SWEEP_VIEW)
    now = timezone.now()
    sort = sort_parse(request.GET, SWEEP_SORTS, default="-slot")
    size = page_size_parse(request.GET, default=SWEEPS_PAGE_SIZE)
    page = keyset_page(Sweep.objects.all(), request.GET, sort=sort, size=size)
    rows = sweeps_history(list(page), now=now, portfolio_ids=scope)
    live = live_kinds_now(now)
    for row in rows:
        # A few queries per running sweep (one or two at a time in practice).
        row["forecast"] = (
            sweep_forecast(row["sweep"], now=now, portfolio_ids=scope, live_kinds=live) if row["running"] else None
        )
    filters = {"sort": sort.param} | per_page_param(size, default=SWEEPS_PAGE_SIZE)
    context = {"page": page, "result": page, "rows": rows, "filters": filters, **per_page_context(size)}
    return render_live(request, "console/sweeps.html", context)


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
        .values("job_kind", "state", "outcome")
        .annotate(n=Count("id"))
        .order_by("job_kind", "state", "outcome")
    )
    letters = list(DeadLetter.objects.filter(portfolio_ids_q(scope), sweep=sweep).order_by("-id")[:PAGE_SIZE])
    forecast = None
    if figures["status"] in {Sweep.Status.ADMITTING, Sweep.Status.RUNNING}:
        now = timezone.now()
        forecast = sweep_forecast(sweep, now=now, portfolio_ids=scope, live_kinds=live_kinds_now(now))
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
            "proof_name": proof_name(sweep.key),
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
    try:
        if fmt == "csv":
            response = HttpResponse(proof_csv_sign(proof=proof), content_type="text/csv")
        else:
            response = JsonResponse(proof_sign(proof=proof))
    except ProofKeyMissing as exc:
        # Never an unsigned proof: an auditor could not tell it from a forged one.
        return HttpResponse(f"{exc}\n", status=503, content_type="text/plain")
    response["Content-Disposition"] = f'attachment; filename="{proof_name(proof["key"])}.{fmt}"'
    return response
