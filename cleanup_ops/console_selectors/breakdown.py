"""The current sweep's jobs by portfolio and by state, for the overview's
charts (issue 39, item 7): one aggregate query, narrowed to the reader's
portfolios, whatever the number of jobs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Count

from cleanup_ops.models import CleanupJob, JobState
from retention.scoping import PortfolioScope, portfolio_ids_q

# The portfolios charted (and tabled): the ones with the most jobs.
PORTFOLIOS_CHARTED = 12


@dataclass
class PortfolioRow:
    portfolio_id: int
    by_state: dict[str, int]
    total: int

    def cells(self) -> list[tuple[str, str, int]]:
        """(state, its label, count) in ``JobState`` order: the table's columns."""
        return [(state, label, self.by_state.get(state, 0)) for state, label in JobState.choices]


@dataclass
class Breakdown:
    by_state: dict[str, int] = field(default_factory=dict)  # every state, in JobState order
    portfolios: list[PortfolioRow] = field(default_factory=list)  # the most jobs first
    portfolios_total: int = 0  # portfolios with jobs (charted or not)

    @property
    def portfolios_left_out(self) -> int:
        return self.portfolios_total - len(self.portfolios)


def jobs_by_portfolio_and_state(*, sweep_id: int | None, portfolio_ids: PortfolioScope) -> Breakdown:
    """The jobs of sweep ``sweep_id`` counted per (portfolio, state); an empty
    breakdown without a sweep. One query."""
    if sweep_id is None:
        return Breakdown(by_state=dict.fromkeys(JobState.values, 0))
    counts = (
        CleanupJob.objects.filter(portfolio_ids_q(portfolio_ids), sweep_id=sweep_id)
        .values_list("portfolio_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    per_portfolio: dict[int, dict[str, int]] = defaultdict(dict)
    by_state = dict.fromkeys(JobState.values, 0)
    for portfolio_id, state, n in counts:
        per_portfolio[portfolio_id][state] = n
        by_state[state] = by_state.get(state, 0) + n
    rows = sorted(
        (PortfolioRow(portfolio_id=p, by_state=s, total=sum(s.values())) for p, s in per_portfolio.items()),
        key=lambda row: (-row.total, row.portfolio_id),
    )
    return Breakdown(by_state=by_state, portfolios=rows[:PORTFOLIOS_CHARTED], portfolios_total=len(rows))
