"""Template filters and tags of the operator console: humanized durations and
times, labels for record kinds, states, outcomes and failure categories,
portfolio names, and links between the console's pages.

Durations read like "7 h 31 min", "3 min 20 s" or "2 d 4 h" (two units at
most); times relative to now like "3 min ago" or "in 40 min", inside a
``<time>`` element whose title is the exact UTC time. Portfolio names come
from a mapping the view fetched with one query (``portfolio_names``), never
one query per row.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from cleanup_ops.checks import DEFAULT_REFRESH_SECONDS
from cleanup_ops.console_selectors.names import LinkReach
from cleanup_ops.models import DeadLetterStatus, JobKind, JobOutcome, JobState, SweepStatus
from cleanup_ops.recovery.classification import FailureCategory
from retention.registry import REGISTRY

register = template.Library()

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
DASH = "—"


def _seconds(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def humanize_seconds(seconds: float, *, parts: int = 2) -> str:
    """``27100.1`` → ``"7 h 31 min"``; ``200`` → ``"3 min 20 s"``; ``0.4`` → ``"0.4 s"``."""
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 10 and seconds != int(seconds):
        return f"{sign}{seconds:.1f} s"
    whole = round(seconds)
    if whole == 0:
        return "0 s"
    out = []
    for name, size in _UNITS:
        n, whole = divmod(whole, size)
        if n:
            out.append(f"{n} {name}")
        elif out:
            break  # "2 h" rather than "2 h 0 min 12 s": only adjacent units
        if len(out) == parts:
            break
    return sign + " ".join(out)


@register.filter
def duration(value: Any) -> str:
    """Seconds (a number) or a ``timedelta`` as "7 h 31 min"; ``None`` as a dash."""
    seconds = _seconds(value)
    return DASH if seconds is None else humanize_seconds(seconds)


def _as_datetime(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


def relative(at: datetime, *, now: datetime) -> str:
    """Like "3 min ago", "in 40 min", or "just now" (under a second either way)."""
    delta = (now - at).total_seconds()
    if abs(delta) < 1:
        return "just now"
    # Coarse under an hour ("3 min ago"), two units above ("7 h 31 min ago").
    text = humanize_seconds(abs(delta), parts=1 if abs(delta) < 3600 else 2)
    return f"{text} ago" if delta > 0 else f"in {text}"


@register.filter
def ago(value: Any) -> str:
    at = _as_datetime(value)
    return DASH if at is None else relative(at, now=timezone.now())


@register.simple_tag
def when(value: Any) -> str:
    """``<time datetime="…" title="2026-08-21 02:00:00 UTC">3 min ago</time>``;
    ``static/console/console.js`` puts the exact time in the viewer's zone
    (zone named) into the title."""
    at = _as_datetime(value)
    if at is None:
        return DASH
    exact = at.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}" data-local="title">{}</time>',
        exact.isoformat(),
        exact.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative(at, now=timezone.now()),
    )


@register.filter
def utc(value: Any) -> str:
    """An exact time: ``<time datetime="…">2026-08-21 02:00 UTC</time>``, which
    ``static/console/console.js`` rewrites in the viewer's zone, the zone
    named ("2026-08-21 04:00 CEST"); without script it stays in UTC, said so."""
    at = _as_datetime(value)
    if at is None:
        return DASH
    exact = at.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-local="text" title="{}">{}</time>',
        exact.isoformat(),
        exact.strftime("%Y-%m-%d %H:%M:%S UTC"),
        exact.strftime("%Y-%m-%d %H:%M UTC"),
    )


_LABELS: dict[str, dict[str, str]] = {
    "kind": {kind: spec.label for kind, spec in REGISTRY.items()},
    "job_kind": dict(JobKind.choices),
    "state": dict(JobState.choices),
    "outcome": dict(JobOutcome.choices),
    "category": dict(FailureCategory.choices),
    "sweep_status": dict(SweepStatus.choices),
    "letter_status": dict(DeadLetterStatus.choices),
}


@register.filter
def label(value: Any, vocabulary: str) -> str:
    """``{{ job.record_kind|label:"kind" }}`` → "Maintenance record"; an
    unknown value is shown as it is, an empty one as a dash."""
    if value in (None, ""):
        return DASH
    return _LABELS.get(vocabulary, {}).get(str(value), str(value))


@register.filter
def get(mapping: Any, key: Any) -> Any:
    if not isinstance(mapping, Mapping):
        return None
    return mapping.get(key)


@register.filter
def portfolio_name(portfolio_id: Any, names: Any) -> str:
    if portfolio_id in (None, ""):
        return "all portfolios"
    name = names.get(portfolio_id) if isinstance(names, Mapping) else None
    return name if name is not None else f"portfolio {portfolio_id} (deleted)"


def _unreachable(reach: Any, kind: str, ident: Any) -> bool:
    """Whether ``reach`` (a ``console_selectors.LinkReach``, or None: every
    page) says the viewer would be refused the page of ``kind`` ``ident``."""
    if not isinstance(reach, LinkReach):
        return False
    if kind == "portfolio":
        return not reach.portfolio(ident)
    return not bool(getattr(reach, kind))


@register.simple_tag
def portfolio_link(portfolio_id: Any, names: Any, reach: Any = None) -> str:
    """The portfolio's name, linked to its console page where ``reach``
    (``console_selectors.LinkReach``) lets the viewer open it."""
    if portfolio_id in (None, ""):
        return "all portfolios"
    if _unreachable(reach, "portfolio", portfolio_id):
        return portfolio_name(portfolio_id, names)
    return format_html(
        '<a href="{}" class="portfolio">{}</a>',
        reverse("console:portfolio", args=[portfolio_id]),
        portfolio_name(portfolio_id, names),
    )


@register.simple_tag
def property_name(property_id: Any, names: Any) -> str:
    """The property's name (``names``: id → name, from ``property_names``)."""
    if property_id in (None, ""):
        return "every property"
    name = names.get(property_id) if isinstance(names, Mapping) else None
    return name if name is not None else f"property {property_id} (deleted)"


@register.simple_tag
def job_link(job_id: Any, reach: Any = None) -> str:
    if job_id in (None, ""):
        return DASH
    if _unreachable(reach, "jobs", job_id):
        return f"job {job_id}"
    return format_html('<a href="{}">job {}</a>', reverse("console:job", args=[job_id]), job_id)


@register.simple_tag
def letter_link(letter_id: Any, reach: Any = None) -> str:
    if letter_id in (None, ""):
        return DASH
    if _unreachable(reach, "letters", letter_id):
        return f"letter {letter_id}"
    return format_html('<a href="{}">letter {}</a>', reverse("console:dead_letter", args=[letter_id]), letter_id)


@register.simple_tag
def sweep_link(sweep_id: Any, key: Any = "", reach: Any = None) -> str:
    """The sweep's key (its slot), linked; ``key`` is the key or a mapping id → key."""
    if sweep_id in (None, ""):
        return DASH
    if isinstance(key, Mapping):
        key = key.get(sweep_id) or key.get(str(sweep_id))
    if _unreachable(reach, "sweeps", sweep_id):
        return str(key or f"sweep {sweep_id}")
    return format_html('<a href="{}">{}</a>', reverse("console:sweep", args=[sweep_id]), key or f"sweep {sweep_id}")


# How an audit event's details read: a label per known key ("from job 3",
# "category Downstream rejected (4xx)"); a key with no value is left out
# (``property_id=None`` says nothing), an unknown one is shown as "key: value".
_DETAIL_LABELS = {
    "policy_id": "policy",
    "number": "version",
    "retention_days": "retention days",
    "enabled": "enabled",
    "role": "role",
    "record_id": "record",
    "pause_id": "pause",
    "count": "count",
    "jobs": "jobs",
    "letters": "letters",
}


@register.simple_tag
def audit_details(details: Any, names: Any, reach: Any = None) -> str:
    """An audit event's details in words, with names for the ids it mentions
    (links only to the pages ``reach`` lets the viewer open)."""
    if not isinstance(details, Mapping):
        return DASH
    names = names if isinstance(names, Mapping) else {}
    parts: list[str] = []
    for key, value in details.items():
        if value in (None, "", [], {}):
            continue
        if key in {"old_job_id", "new_job_id", "job_id"}:
            prefix = {"old_job_id": "from ", "new_job_id": "new ", "job_id": ""}[key]
            parts.append(format_html("{}{}", prefix, job_link(value, reach)))
        elif key == "sweep_id":
            parts.append(format_html("sweep {}", sweep_link(value, names.get("sweeps", {}), reach)))
        elif key == "portfolio_id":
            parts.append(portfolio_link(value, names.get("portfolios", {}), reach))
        elif key == "property_id":
            parts.append(format_html("{}", property_name(value, names.get("properties", {}))))
        elif key == "user_id":
            parts.append(format_html("user {}", names.get("users", {}).get(str(value), f"#{value}")))
        elif key == "category":
            parts.append(format_html("category {}", label(value, "category")))
        elif key == "record_kind":
            parts.append(format_html("{}", label(value, "kind")))
        elif key == "job_ids" and isinstance(value, list):
            shown = format_html(", ".join(["{}"] * min(len(value), 10)), *[job_link(v, reach) for v in value[:10]])
            more = f" and {len(value) - 10} more" if len(value) > 10 else ""
            parts.append(format_html("{} job{}: {}{}", len(value), "" if len(value) == 1 else "s", shown, more))
        else:
            parts.append(format_html("{} {}", _DETAIL_LABELS.get(key, key.replace("_", " ")), value))
    return format_html(", ".join(["{}"] * len(parts)), *parts) if parts else DASH


@register.simple_tag(takes_context=True)
def query(context: Any, **changes: Any) -> str:
    """The current filters (``filters`` in the context) with ``changes``, as a
    query string for a link: ``?{% query page=2 %}``."""
    params = dict(context.get("filters") or {})
    for name, value in changes.items():
        if value in (None, ""):
            params.pop(name, None)
        else:
            params[name] = value
    return urlencode(params)


@register.simple_tag(takes_context=True)
def live_attrs(context: Any) -> str:
    """The attributes of a page's ``#live`` fragment: htmx re-fetches it every
    ``refresh_seconds`` and swaps it in place, unless ``consoleMayRefresh()``
    (``static/console/console.js``) says no: the tab is hidden, live refresh
    is switched off, or the operator is selecting or typing in the fragment.
    Coming back to the tab refreshes at once. That test is console.js's
    ``htmx:confirm`` handler, not an htmx trigger filter (``[…]``): htmx
    compiles a filter with ``eval``, which the Content-Security-Policy refuses."""
    request = context["request"]
    seconds = int(context.get("refresh_seconds") or DEFAULT_REFRESH_SECONDS)
    return format_html(
        'id="live" hx-get="{}" hx-trigger="every {}s, visibilitychange from:document" '
        'hx-target="this" hx-swap="outerHTML" '
        'hx-request=\'{{"timeout": {}}}\' data-generated="{}"',
        request.get_full_path(),
        seconds,
        # A refresh that hangs is a failed one (the page then says it is stale).
        max(5, seconds * 2) * 1000,
        timezone.now().isoformat(timespec="seconds"),
    )


# The effective limits (``ratelimit.effective_limits``): a label and how to show the value.
LIMITS: dict[str, tuple[str, str]] = {
    "global_rate_per_s": ("Delete batches per second, all workers", "rate"),
    "global_burst": ("Burst of batches, all workers", "count"),
    "portfolio_rate_per_s": ("Delete batches per second, per portfolio", "rate"),
    "portfolio_burst": ("Burst of batches, per portfolio", "count"),
    "portfolio_max_leases": ("Concurrent leases per portfolio", "count"),
    "batch_size": ("Rows per delete batch", "count"),
    "max_attempts": ("Failed attempts before a dead letter", "count"),
    "max_age_seconds": ("Age budget from a job's first attempt", "seconds"),
    "backoff_base_seconds": ("Retry backoff, base", "seconds"),
    "backoff_cap_seconds": ("Retry backoff, cap", "seconds"),
    "docstore_global_rate_per_s": ("Document-store deletes per second, all workers", "rate"),
    "docstore_portfolio_rate_per_s": ("Document-store deletes per second, per portfolio", "rate"),
}


@register.filter
def limit_label(key: str) -> str:
    return LIMITS.get(key, (key.replace("_", " "), ""))[0]


@register.filter
def limit_value(value: Any, key: str) -> str:
    kind = LIMITS.get(key, ("", ""))[1]
    if kind == "rate":
        return "unlimited" if not value else f"{value:g} /s"
    if kind == "seconds":
        return duration(value)
    return str(value)


@register.filter
def absolute(value: Any) -> Any:
    try:
        return abs(value)
    except TypeError:
        return value


@register.filter
def urlparams(params: Any) -> str:
    """A mapping of parameters as a query string: ``?{{ group.params|urlparams }}``."""
    return urlencode(params) if isinstance(params, Mapping) else ""


@register.simple_tag(takes_context=True)
def sort_header(context: Any, text: str, name: str, css: str = "") -> str:
    """A sortable column's ``<th>``: a link that sorts by it (the other way
    when it is the current sort) and ``aria-sort`` on the current column.
    Sorting starts again at the first page (``after``/``before`` dropped)."""
    sort = context.get("result") or context.get("page")
    current = getattr(sort, "sort", None)
    if current is None:
        return format_html('<th scope="col" class="{}">{}</th>', css, text)
    params = {k: v for k, v in dict(context.get("filters") or {}).items() if k not in {"after", "before", "last"}}
    params["sort"] = current.toggled(name)
    state = ""
    arrow = ""
    if current.name == name:
        state = "descending" if current.descending else "ascending"
        arrow = " ▼" if current.descending else " ▲"
    return format_html(
        '<th scope="col" class="{}"{}><a href="?{}" data-sort="{}">{}<span aria-hidden="true">{}</span></a></th>',
        css,
        format_html(' aria-sort="{}"', state) if state else "",
        urlencode(params),
        name,
        text,
        arrow,
    )


# The list pages' filter tokens: how each parameter reads, and the
# vocabulary of its values (``_LABELS``).
_TOKEN_WORDS = {
    "q": ("search", None),
    "sweep": ("sweep", None),
    "state": ("state", "state"),
    "status": ("status", "letter_status"),
    "portfolio": ("portfolio", None),
    "kind": ("kind", "kind"),
    "category": ("category", "category"),
    "job_kind": ("job kind", "job_kind"),
    "http_status": ("HTTP status", None),
    "older_than_hours": ("older than (hours)", None),
    "id_min": ("from job", None),
    "id_max": ("to job", None),
    "redrives": ("redrives only", None),
}
# Not filters: how the list is shown, not which rows.
_NOT_FILTERS = frozenset({"sort", "per_page", "after", "before", "last"})


def _token_value(context: Any, name: str, value: str) -> str:
    vocabulary = _TOKEN_WORDS.get(name, (name, None))[1]
    if vocabulary is not None:
        return _LABELS.get(vocabulary, {}).get(value, value)
    if name == "portfolio":
        found = {str(p["id"]): p["name"] for p in context.get("portfolios") or []}
        return found.get(value, value)
    if name == "sweep":
        found = {str(s["id"]): s["key"] for s in context.get("sweeps") or []}
        return found.get(value, value)
    if name == "http_status" and value == "0":
        return "none"
    return value


@register.inclusion_tag("console/_filter_tokens.html", takes_context=True)
def filter_tokens(context: Any, blank: str = "") -> dict[str, Any]:
    """The active filters (``filters`` in the context) as removable tokens,
    "portfolio: Acme Lettings" and a cross: each a link to the same list without that
    one filter (from the first page; the sort and page size kept). ``blank``
    names filters that a missing parameter would put back to their default
    (the inbox's ``status=open``): removing one sends it empty ("any")."""
    params = dict(context.get("filters") or {})
    blanks = set(blank.split(",")) if blank else set()
    kept = {k: v for k, v in params.items() if k not in {"after", "before", "last"}}
    tokens = []
    for name, value in params.items():
        if name in _NOT_FILTERS or value in (None, ""):
            continue
        rest = {k: v for k, v in kept.items() if k != name} | ({name: ""} if name in blanks else {})
        word = _TOKEN_WORDS.get(name, (name.replace("_", " "), None))[0]
        shown = "" if name == "redrives" else _token_value(context, name, str(value))
        tokens.append({"name": name, "word": word, "value": shown, "href": "?" + urlencode(rest)})
    return {"tokens": tokens}
