"""Dead letters grouped by cause (category, HTTP status, record kind), with
counts, what to do, and one decision per group.

A group's decision is the inbox's bulk decision (``dead_letters_bulk``) with
the group's filter: the same count to confirm, the same required reason,
the same service (``dead_letters_decide``) and one audit event per letter.
Only open letters are grouped (only they can be decided); the inbox's other
filters (portfolio, sweep, age) narrow the groups and are kept in the links.
"""

from __future__ import annotations

from dataclasses import replace

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse

from cleanup_ops.console_selectors import portfolio_choices
from cleanup_ops.console_selectors.letters import letter_groups
from cleanup_ops.models import DeadLetter
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.selectors import NO_HTTP_STATUS, dead_letter_filter_parse, dead_letters
from cleanup_ops.views.common import LETTER_VIEW, bad_input_as_400, render_live
from retention.scoping import portfolio_ids_where, scope_queryset


@login_required
@permission_required(LETTER_VIEW, raise_exception=True)
@bad_input_as_400
def dead_letter_groups(request: HttpRequest) -> HttpResponse:
    parsed = dead_letter_filter_parse(request.GET, strict=True)
    letter_filter = replace(parsed, status=DeadLetter.Status.OPEN, letter_ids=None)
    letters = scope_queryset(dead_letters(letter_filter), request.user, perm=LETTER_VIEW)
    groups = letter_groups(letters)
    base = {
        k: v for k, v in letter_filter.as_params().items() if k not in {"status", "category", "http_status", "kind"}
    }
    for group in groups:
        status = NO_HTTP_STATUS if group["http_status"] is None else group["http_status"]
        group["params"] = base | {
            "category": group["category"],
            "http_status": str(status),
            "kind": group["record_kind"],
        }
    return render_live(
        request,
        "console/dead_letter_groups.html",
        {
            "groups": groups,
            "total": sum(group["n"] for group in groups),
            "filters": letter_filter.as_params(),
            "portfolios": portfolio_choices(portfolio_ids=portfolio_ids_where(request.user, LETTER_VIEW)),
            "categories": FailureCategory.choices,
            "can_redrive": request.user.has_perm("cleanup_ops.redrive_deadletter"),
            "can_dismiss": request.user.has_perm("cleanup_ops.dismiss_deadletter"),
        },
    )
