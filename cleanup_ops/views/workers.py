"""Worker clusters, their leases and the broker's queues."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from cleanup_ops.console_selectors import (
    workers_overview,
)
from cleanup_ops.dispatch import broker_status
from cleanup_ops.views.common import (
    render_live,
)


@login_required
@permission_required("cleanup_ops.view_workerheartbeat", raise_exception=True)
def workers_page(request: HttpRequest) -> HttpResponse:
    """Worker clusters (heartbeats, last progress, liveness), the leases each
    worker holds and expired leases waiting to be recovered; the broker's
    queues (messages waiting, through django-q2's broker interface)."""
    return render_live(
        request, "console/workers.html", {"w": workers_overview(now=timezone.now()), "broker": broker_status()}
    )
