"""What every console page shares: the permissions pages need, the 400 page
naming a bad parameter, live fragments, and the way back after a POST."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from cleanup_ops.checks import refresh_seconds as console_refresh_seconds
from cleanup_ops.console_selectors.holds import holds_covering
from cleanup_ops.console_selectors.names import property_names
from cleanup_ops.console_selectors.workers import live_job_kinds, start_command
from cleanup_ops.dispatch import queues
from cleanup_ops.recovery.operator import MIN_REASON_LENGTH
from retention.filters import FilterError
from retention.inputs import InputError, visible_length
from retention.inputs import reason_problem as reason_rule_problem
from retention.scoping import may_act_in

VIEW_PERM = "cleanup_ops.view_cleanupjob"
LETTER_VIEW = "cleanup_ops.view_deadletter"
SWEEP_VIEW = "cleanup_ops.view_sweep"
PAUSE_VIEW = "cleanup_ops.view_pipelinepause"
HOLD_VIEW = "retention.view_legalhold"
PAGE_SIZE = 50
_View = TypeVar("_View", bound=Callable[..., HttpResponseBase])


def counted(n: int, noun: str, plural: str = "") -> str:
    """``counted(1, "job")`` → "1 job", ``counted(2, "job")`` → "2 jobs": never a "(s)"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def were(n: int, one: str = "was", many: str = "were") -> str:
    """The word that agrees with ``n``: ``were(1)`` → "was", ``were(2, "is", "are")`` → "are"."""
    return one if n == 1 else many


PER_PAGE_CHOICES = (20, 50, 100, 200)  # the chooser's; any size from 1 to PER_PAGE_MAX is accepted


def per_page_param(size: int, *, default: int = PAGE_SIZE) -> dict[str, str]:
    """The ``per_page`` a list's links carry: none at the default size."""
    return {} if size == default else {"per_page": str(size)}


def per_page_context(size: int) -> dict[str, Any]:
    """The rows-per-page chooser's context (``_per_page.html``)."""
    return {"per_page": size, "per_page_choices": sorted({*PER_PAGE_CHOICES, size})}


def bad_request(request: HttpRequest, field: str, message: str) -> HttpResponse:
    """400 naming the parameter; nothing was changed."""
    back = request.path if request.method == "GET" else reverse("console:overview")
    context = {"field": field, "message": message, "back": back}
    return render(request, "console/bad_request.html", context, status=400)


def bad_input_as_400(view: _View) -> _View:
    """A ``FilterError`` or ``InputError`` raised while a page reads its
    parameters becomes a 400 naming the parameter."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            return view(request, *args, **kwargs)
        except (FilterError, InputError) as exc:
            return bad_request(request, exc.field, exc.message)

    return cast(_View, wrapped)


def holds_context(
    request: HttpRequest, *, portfolio_id: int, partition: tuple[int | None, str] | None = None
) -> dict[str, Any]:
    """The active holds covering a scope (``console_selectors.holds``), for a
    reader who may see the holds of that portfolio; ``holds`` is None otherwise."""
    if not may_act_in(request.user, HOLD_VIEW, portfolio_id):
        return {"holds": None}
    holds = holds_covering(portfolio_id=portfolio_id, partition=partition)
    return {"holds": holds, "hold_property_names": property_names(h.property_id for h in holds.holds)}


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_stream(rows: Iterable[list[Any]], *, filename: str) -> StreamingHttpResponse:
    """A CSV download streamed row by row (``console_selectors.exports``)."""
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse((writer.writerow(row) for row in rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response


# --- Live fragments and charts -------------------------------------------------

LIVE_TARGET = "live"


def refresh_seconds() -> int:
    """How often a live page re-fetches its fragment (``CONSOLE_REFRESH_SECONDS``,
    default 5 s; ``cleanup_ops.checks`` validates it)."""
    return console_refresh_seconds()


def render_live(request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    """A live page: the whole page, or only its ``#live`` fragment
    (``<name>_live.html``) when the poller in ``static/console/console.js``
    asks for it (htmx sends ``HX-Request`` and ``HX-Target``)."""
    context = {
        **context,
        "refresh_seconds": refresh_seconds(),
        "live_target": LIVE_TARGET,
        "stale_seconds": settings.CLEANUP_LIVENESS_STALE_SECONDS,
    }
    if request.headers.get("HX-Request") == "true" and request.headers.get("HX-Target") == LIVE_TARGET:
        template = template.replace(".html", "_live.html")
    response = render(request, template, context, status=status)
    response["Vary"] = "HX-Request, HX-Target"
    return response


def redirect_back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """To the console page in ``next`` (a local path only), else ``default``."""
    target = request.POST.get("next") or ""
    console = reverse("console:overview")
    if not (target.startswith(console) and url_has_allowed_host_and_scheme(target, allowed_hosts=None)):
        target = reverse(default)
    return HttpResponseRedirect(target)


def live_kinds_now(now: datetime) -> set[str]:
    """Job kinds whose queue has a cluster that reported lately (the forecast's
    and the "waiting" figures' notion of "a worker will take it")."""
    return live_job_kinds(now=now, queues=queues())


def start_commands() -> dict[str, str]:
    """Job kind -> the command that starts a cluster serving its queue (the
    console's hint when no worker will run new work)."""
    return {kind: start_command(queue) for queue, kinds in queues().items() for kind in kinds}


def reason_problem(reason: str) -> str | None:
    """Why a decision's reason is refused (the services' own rule,
    ``MIN_REASON_LENGTH``), said before anything is attempted; None if it is fine."""
    problem = reason_rule_problem(reason, field="reason")
    if problem is not None and visible_length(reason) < MIN_REASON_LENGTH:
        return (
            f"A reason of at least {MIN_REASON_LENGTH} characters is required; it goes into the audit trail"
            " (spaces and invisible characters do not count)."
        )
    return problem
