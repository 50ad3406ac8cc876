"""The audit log: filtered by action (a part of it), object, actor (a name
or an id) and free text (``q``), with the details in words."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from cleanup_ops.console_selectors import audit_names, link_reach
from cleanup_ops.console_selectors.names import SEARCH_MAX_LENGTH
from cleanup_ops.console_selectors.search import audit_search_q
from cleanup_ops.views.common import LETTER_VIEW, PAGE_SIZE, VIEW_PERM, bad_input_as_400
from retention.filters import audit_events, audit_filter_parse, text_param
from retention.scoping import scope_audit_events


@login_required
@permission_required("retention.view_auditevent", raise_exception=True)
@bad_input_as_400
def audit_log(request: HttpRequest) -> HttpResponse:
    audit_filter = audit_filter_parse(request.GET, strict=True)
    events = scope_audit_events(audit_events(audit_filter), request.user)
    text = text_param(request.GET, "q", strict=True, max_length=SEARCH_MAX_LENGTH)
    if text:
        events = events.filter(audit_search_q(text))
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    names = audit_names(page)
    filters = audit_filter.as_params() | ({"q": text} if text else {})
    return render(
        request,
        "console/audit.html",
        {
            "page": page,
            "filters": filters,
            "names": names["portfolios"],
            "detail_names": names,
            # Links only to the pages the viewer may open (a manager reads the log, not the pipeline).
            "reach": link_reach(request.user, page_perm=VIEW_PERM, letter_perm=LETTER_VIEW),
        },
    )
