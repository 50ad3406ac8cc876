from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from retention.conf import MAX_BATCH_SIZE
from retention.eligibility import count_expired_and_held
from retention.models import PolicyVersion


def policy_version_active(*, policy_id: int) -> PolicyVersion | None:
    return PolicyVersion.objects.filter(policy_id=policy_id, status=PolicyVersion.Status.APPROVED).first()


# Measured deletion rate of a record kind (rows per second), or None when
# unknown. The pipeline (which keeps the ledger, a layer above this app)
# provides it at start-up: ``throughput_provider_set``.
_throughput: Callable[[str], float | None] | None = None


def throughput_provider_set(provider: Callable[[str], float | None]) -> None:
    global _throughput
    _throughput = provider


@dataclass(frozen=True)
class ImpactPreview:
    active_days: int | None
    active_enabled: bool
    proposed_days: int
    proposed_enabled: bool
    expired_now: int
    held_now: int
    expired_after: int
    held_after: int
    active_batch_size: int | None = None
    proposed_batch_size: int = MAX_BATCH_SIZE
    rows_per_second: float | None = None  # measured for this record kind, if known

    @property
    def batches_now(self) -> int:
        """Batches the currently eligible rows take at the active batch size."""
        return math.ceil(self.eligible_now / self.active_batch_size) if self.active_batch_size else 0

    @property
    def batches_after(self) -> int:
        """Batches the rows eligible after approval take at the proposed batch size."""
        return math.ceil(self.eligible_after / self.proposed_batch_size)

    @property
    def seconds_after(self) -> float | None:
        """Those rows at the measured rate, when one is known."""
        return self.eligible_after / self.rows_per_second if self.rows_per_second else None

    @property
    def time_after_text(self) -> str | None:
        """``seconds_after`` as a person would say it: "under a second" (never
        "about 0 s"), "about 40 s", "about 3 min", "about 2 h"."""
        seconds = self.seconds_after
        if seconds is None:
            return None
        if seconds < 1:
            return "under a second"
        if seconds < 90:
            return f"about {round(seconds)} s"
        if seconds < 90 * 60:
            return f"about {round(seconds / 60)} min"
        return f"about {round(seconds / 3600)} h"

    @property
    def eligible_now(self) -> int:
        return self.expired_now - self.held_now if self.active_enabled and self.active_days else 0

    @property
    def eligible_after(self) -> int:
        return self.expired_after - self.held_after if self.proposed_enabled else 0


def policy_version_impact(*, version: PolicyVersion) -> ImpactPreview:
    """What approving ``version`` would change, as counts across the portfolio."""
    policy = version.policy
    active = policy_version_active(policy_id=policy.pk)
    now = timezone.now()
    expired_now = held_now = 0
    if active is not None:
        expired_now, held_now = count_expired_and_held(
            policy.record_kind, cutoff=now - timedelta(days=active.retention_days), portfolio_id=policy.portfolio_id
        )
    expired_after, held_after = count_expired_and_held(
        policy.record_kind, cutoff=now - timedelta(days=version.retention_days), portfolio_id=policy.portfolio_id
    )
    return ImpactPreview(
        active_days=active.retention_days if active else None,
        active_enabled=active.enabled if active else False,
        proposed_days=version.retention_days,
        proposed_enabled=version.enabled,
        expired_now=expired_now,
        held_now=held_now,
        expired_after=expired_after,
        held_after=held_after,
        active_batch_size=active.batch_size if active else None,
        proposed_batch_size=version.batch_size,
        rows_per_second=_throughput(policy.record_kind) if _throughput else None,
    )
