"""What a bulk confirmation page showed, so that confirming acts on exactly that.

A bulk decision (redrive or dismiss every letter matching a filter; run now
or cancel every job matching one) is shown first with its count and a
breakdown, then confirmed. Between the two, letters and jobs come and go: a
count alone would let a letter that appeared after the page was shown be
decided, and one that was shown and vanished be replaced by another, with
the same number. So the page carries a digest of the ids it covers
(``selection_digest``), and confirming re-reads the matching ids: when they
differ (``selection_changed``), nothing happens and the page asks again.

The digest names ids only (no record contents); it is not a secret, just a
compact fingerprint of the set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet


def selection_ids(matching: QuerySet[Any]) -> list[int]:
    return sorted(matching.values_list("id", flat=True))


def selection_digest(ids: Iterable[int]) -> str:
    """A sha256 over the sorted ids: what the confirmation page showed."""
    text = ",".join(str(i) for i in sorted(ids))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def selection_changed(*, seen: str, ids: list[int], expected: int | None, noun: str) -> str | None:
    """Why confirming must ask again (the ids matching now are not the ids
    shown), or ``None``. ``seen`` is the digest the page carried; a missing
    one (a form from before this check) counts as a change."""
    if expected is not None and expected != len(ids):
        return f"The number of {noun} matching changed from {expected} to {len(ids)}; check and confirm again."
    if seen and seen == selection_digest(ids):
        return None
    return (
        f"The {noun} matching changed since the page was shown (some appeared, some are gone),"
        f" though there are still {len(ids)}; check and confirm again."
    )
