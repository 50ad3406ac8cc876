"""Reads of the console's pages, one module per subject: ``names`` (ids to
names), ``jobs``, ``sweeps`` (history and the drain forecast),
``dead_letters``, ``workers``, ``audit``, ``pauses`` (and one portfolio),
``search``, and ``overview`` (the overview page's figures, which the API's
metrics and the Prometheus exporter serve too). The same rules as
``cleanup_ops.selectors``:

- every function issues a fixed number of queries whatever the data size
  (aggregates and bounded lists, never a query per row);
- every read of tenant data takes ``portfolio_ids`` (``None``: every
  portfolio, the platform's staff; a set: a customer's staff, from
  ``retention.scoping.portfolio_ids_where`` for the page's permission) and narrows with
  ``retention.scoping.portfolio_ids_q``;
- filters are parsed once from request parameters (``job_filter_parse``,
  like ``selectors.dead_letter_filter_parse``), strictly for the API and
  leniently for the console's links.

The drain forecast is a pure function of counts and times
(``drain_forecast``); ``sweep_forecast`` only gathers its inputs.
"""

from cleanup_ops.console_selectors.jobs import (
    JobFilter,
    JobsPage,
    job_chain,
    job_detail,
    job_filter_parse,
    jobs_page,
)
from cleanup_ops.console_selectors.names import (
    LinkReach,
    PortfolioScope,
    audit_names,
    link_reach,
    portfolio_choices,
    portfolio_names,
    property_names,
    sweep_keys,
    usernames,
)
from cleanup_ops.console_selectors.pauses import (
    jobs_mark_paused,
    paused_portfolio_ids,
    pauses_overview,
    portfolio_summary,
)
from cleanup_ops.console_selectors.sweeps import (
    DrainForecast,
    ForecastStatus,
    drain_forecast,
    next_slot_after,
    sweep_forecast,
    sweeps_figures,
    sweeps_history,
)
from cleanup_ops.console_selectors.workers import workers_overview

__all__ = [
    "DrainForecast",
    "ForecastStatus",
    "JobFilter",
    "JobsPage",
    "LinkReach",
    "PortfolioScope",
    "audit_names",
    "drain_forecast",
    "job_chain",
    "job_detail",
    "job_filter_parse",
    "jobs_mark_paused",
    "jobs_page",
    "link_reach",
    "next_slot_after",
    "paused_portfolio_ids",
    "pauses_overview",
    "portfolio_choices",
    "portfolio_names",
    "portfolio_summary",
    "property_names",
    "sweep_forecast",
    "sweep_keys",
    "sweeps_figures",
    "sweeps_history",
    "usernames",
    "workers_overview",
]
