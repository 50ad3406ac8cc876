"""Search: one box in the header, over jobs, dead letters and audit events
(``console_selectors.search``), each list limited to what the reader's roles
let them read, with a link to the full filtered list."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from cleanup_ops.console_selectors import audit_names, link_reach, portfolio_names, property_names
from cleanup_ops.console_selectors.names import SEARCH_MAX_LENGTH
from cleanup_ops.console_selectors.search import SEARCH_RESULTS, search_everything
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.views.common import LETTER_VIEW, VIEW_PERM, bad_input_as_400
from retention.filters import text_param
from retention.models import AuditEvent
from retention.scoping import portfolio_ids_where, scope_audit_events


@login_required
@bad_input_as_400
def search_page(request: HttpRequest) -> HttpResponse:
    text = (text_param(request.GET, "q", strict=True, max_length=SEARCH_MAX_LENGTH) or "").strip()
    user = request.user
    may_jobs, may_letters = user.has_perm(VIEW_PERM), user.has_perm(LETTER_VIEW)
    may_audit = user.has_perm("retention.view_auditevent")
    results = None
    if text:
        results = search_everything(
            text,
            job_scope=portfolio_ids_where(user, VIEW_PERM) if may_jobs else frozenset(),
            letter_scope=portfolio_ids_where(user, LETTER_VIEW) if may_letters else frozenset(),
            audit_events=scope_audit_events(AuditEvent.objects.all(), user) if may_audit else None,
            job_allowed=may_jobs,
            letter_allowed=may_letters,
        )
    rows: list[CleanupJob | DeadLetter] = [*(results.jobs if results else []), *(results.letters if results else [])]
    events = results.events if results else []
    return render(
        request,
        "console/search.html",
        {
            "search_text": text,
            "results": results,
            "limit": SEARCH_RESULTS,
            "may_jobs": may_jobs,
            "may_letters": may_letters,
            "may_audit": may_audit,
            "names": portfolio_names(r.portfolio_id for r in rows),
            "property_names": property_names(r.property_id for r in rows),
            "detail_names": audit_names(events),
            "reach": link_reach(user, page_perm=VIEW_PERM, letter_perm=LETTER_VIEW),
        },
    )
