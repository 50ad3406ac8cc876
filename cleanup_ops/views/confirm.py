"""What a bulk confirmation page showed, so that confirming acts on exactly that.

A bulk decision (redrive or dismiss every letter matching a filter; run now
or cancel every job matching one) is shown first with its count and a
breakdown, then confirmed. Between the two, letters and jobs come and go: a
count alone would let a letter that appeared after the page was shown be
decided, and one that was shown and vanished be replaced by another, with
the same number. So the page carries a digest of the ids it covers
(``cleanup_ops.selectors.selection_digest``, the API's bulk decision by
filter checks the same one), and confirming re-reads the matching ids: when
they differ (``selection_changed``), nothing happens and the page asks again.

``bulk_confirmation`` is the one flow of both bulk pages (jobs and dead
letters): the reason, the count, the digest, and — only when every check
passes — the ids to act on, pinned, so a decision never reaches beyond what
the page showed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict

from cleanup_ops.recovery.operator import MIN_REASON_LENGTH
from cleanup_ops.selectors import selection_changed, selection_digest, selection_ids
from cleanup_ops.views.common import reason_problem
from retention.filters import int_param
from retention.inputs import MAX_ID, MAX_TEXT_LENGTH, text_check

# Rows of a bulk page's breakdown (by customer and kind or category).
BULK_BREAKDOWN_ROWS = 20


@dataclass
class BulkConfirmation:
    """Where a bulk page stands: what it shows, and the ids to act on once
    confirmed (``pinned``; None while it only shows, or asks again)."""

    reason: str
    count: int
    seen: str
    errors: list[str] = field(default_factory=list)
    pinned: tuple[int, ...] | None = None

    def context(self, *, breakdown: list[dict[str, Any]]) -> dict[str, Any]:
        """The template context both bulk pages share."""
        return {
            "count": self.count,
            "reason": self.reason,
            "errors": self.errors,
            "breakdown": breakdown,
            "breakdown_more": len(breakdown) == BULK_BREAKDOWN_ROWS,
            "min_reason": MIN_REASON_LENGTH,
            "seen": self.seen,
        }


def bulk_confirmation(
    *, method: str, params: QueryDict, matching: QuerySet[Any], noun: str, none_left: str
) -> BulkConfirmation:
    """The confirm-count-reason flow of a bulk decision over ``matching``.

    A GET (or a POST without ``confirm=yes``) only shows. A confirming POST
    passes when the reason meets the rule, something still matches, and the
    ids matching are the ones shown (``expected``, ``seen``); then
    ``pinned`` holds them. Otherwise ``errors`` says why, and nothing is
    acted on."""
    ids = selection_ids(matching)
    reason = text_check(params.get("reason", ""), field="reason", max_length=MAX_TEXT_LENGTH)
    page = BulkConfirmation(reason=reason, count=len(ids), seen=selection_digest(ids))
    if method != "POST" or params.get("confirm") != "yes":
        return page
    expected = int_param(params, "expected", strict=True, minimum=0, maximum=MAX_ID)
    problem = reason_problem(reason)
    if problem:
        page.errors.append(problem)
    elif not ids:
        page.errors.append(none_left)
    elif changed := selection_changed(seen=params.get("seen", ""), ids=ids, expected=expected, noun=noun):
        page.errors.append(changed.message)
    else:
        page.pinned = tuple(ids)
    return page
