"""The active legal holds that cover a portfolio or a job's scope, for the
console's portfolio and job pages (issue 39, item 7): an operator looking at
a job that deletes nothing sees at once the hold that keeps its rows.

Two queries whatever the number of holds: the count and the newest
``HOLDS_SHOWN`` (with who placed them)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from retention.models import LegalHold

HOLDS_SHOWN = 20


@dataclass(frozen=True)
class HoldsCovering:
    holds: list[LegalHold]  # the newest HOLDS_SHOWN
    count: int  # all of them

    @property
    def more(self) -> int:
        return self.count - len(self.holds)


def holds_covering(*, portfolio_id: int, partition: tuple[int | None, str] | None = None) -> HoldsCovering:
    """Active holds of ``portfolio_id`` whose scope meets the given one.

    Without ``partition``: every active hold in the portfolio (a hold narrowed
    to a property, a kind or a record covers part of it). With a job's
    ``(property_id, record_kind)``: the holds of the whole portfolio or of that
    property, of every kind or of that kind, and the holds of single records
    in that scope. A kind without a property (``property_id`` None) is
    covered by no property's hold."""
    q = Q(portfolio_id=portfolio_id)
    if partition is not None:
        property_id, record_kind = partition
        q &= Q(property_id__isnull=True) | (Q(property_id=property_id) if property_id is not None else Q(pk__in=[]))
        q &= Q(record_kind="") | Q(record_kind=record_kind)
    active = LegalHold.objects.active().filter(q)
    count = active.count()
    holds = list(active.select_related("placed_by").order_by("-placed_at", "-id")[:HOLDS_SHOWN])
    return HoldsCovering(holds=holds, count=count)
