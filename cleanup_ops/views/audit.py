"""The audit log."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from cleanup_ops.console_selectors import (
    portfolio_names,
)
from cleanup_ops.views.common import (
    PAGE_SIZE,
    bad_input_as_400,
)
from retention.filters import audit_events, audit_filter_parse
from retention.scoping import (
    scope_audit_events,
)


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
