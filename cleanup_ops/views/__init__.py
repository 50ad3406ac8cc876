"""Operator console: server-rendered pages, login required, role-aware, one
module per subject (sweeps, jobs, dead letters, workers, audit, pauses and
portfolios, search, the overview); ``common`` holds what they share.

Every page issues a fixed number of queries whatever the data size (the
figures come from aggregate selectors; lists are paginated). Writes go through
services, need a reason, and leave audit events; every action (on dead letters
and on jobs) adds a confirmation step before anything changes.

A customer's staff see only the portfolios where their role grants the
permission a page requires (``retention.scoping.portfolio_ids_where`` with
that permission — not every portfolio they are a member of): every figure,
list and export below is narrowed with it; sweeps themselves are the
platform's schedule and visible to every role that reaches them, with the
customer's own figures. A user whose roles reach no console page lands on
``console/landing.html`` (where their roles do lead), never on a bare 403.

Bad input: filters and ids are parsed strictly (``retention.filters``,
``retention.inputs``); an invalid one answers 400 naming the parameter
(``console/bad_request.html``) and changes nothing.

The Prometheus exporter is ``cleanup_ops.prometheus``, not a page.
"""

from cleanup_ops.views.audit import audit_log
from cleanup_ops.views.dead_letters import (
    dead_letter_action,
    dead_letter_inbox,
    dead_letter_page,
    dead_letters_bulk,
    dead_letters_export,
)
from cleanup_ops.views.job_selection import jobs_selected
from cleanup_ops.views.jobs import job_action, job_page, jobs_bulk, jobs_export, jobs_list
from cleanup_ops.views.letter_groups import dead_letter_groups
from cleanup_ops.views.overview import overview_page
from cleanup_ops.views.pauses import pause_toggle, pauses_page, portfolio_page
from cleanup_ops.views.search import search_page
from cleanup_ops.views.sweeps import sweep_page, sweep_proof_export, sweeps_list
from cleanup_ops.views.workers import cluster_control, limit_change, workers_page

__all__ = [
    "audit_log",
    "cluster_control",
    "dead_letter_action",
    "dead_letter_groups",
    "dead_letter_inbox",
    "dead_letter_page",
    "dead_letters_bulk",
    "dead_letters_export",
    "job_action",
    "job_page",
    "jobs_bulk",
    "jobs_export",
    "jobs_list",
    "jobs_selected",
    "limit_change",
    "overview_page",
    "pause_toggle",
    "pauses_page",
    "portfolio_page",
    "search_page",
    "sweep_page",
    "sweep_proof_export",
    "sweeps_list",
    "workers_page",
]
