"""Token buckets in the database, shared by every worker on every host.

One bucket is a row (``RateBucket``). Taking a token is one conditional
UPDATE that refills the bucket for the time elapsed since ``updated_at`` and
takes a token only if one is there, so concurrent workers never over-spend:
the row lock serialises them and each sees the other's result. The portfolio
bucket is taken before the global one in every transaction (a fixed order, so
two workers cannot deadlock on them), and both are taken or neither.

Time is passed in (epoch seconds from ``timezone.now()``) so tests control it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from cleanup_ops import sql
from cleanup_ops.models import RateBucket


@dataclass(frozen=True)
class BucketConfig:
    name: str
    rate: float  # tokens per second; 0 = unlimited
    burst: float


def effective_limits() -> dict[str, float | int]:
    return {
        "global_rate_per_s": settings.CLEANUP_RATE_GLOBAL,
        "global_burst": settings.CLEANUP_BURST_GLOBAL,
        "portfolio_rate_per_s": settings.CLEANUP_RATE_PORTFOLIO,
        "portfolio_burst": settings.CLEANUP_BURST_PORTFOLIO,
        "portfolio_max_leases": settings.CLEANUP_PORTFOLIO_MAX_LEASES,
        "batch_size": settings.CLEANUP_BATCH_SIZE,
        "max_attempts": settings.CLEANUP_MAX_ATTEMPTS,
        "max_age_seconds": settings.CLEANUP_MAX_AGE_SECONDS,
        "backoff_base_seconds": settings.CLEANUP_BACKOFF_BASE_SECONDS,
        "backoff_cap_seconds": settings.CLEANUP_BACKOFF_CAP_SECONDS,
        "docstore_global_rate_per_s": settings.DOCSTORE_RATE_GLOBAL,
        "docstore_portfolio_rate_per_s": settings.DOCSTORE_RATE_PORTFOLIO,
    }


def portfolio_buckets(portfolio_id: int) -> list[BucketConfig]:
    if settings.CLEANUP_RATE_PORTFOLIO <= 0:
        return []
    return [
        BucketConfig(f"portfolio:{portfolio_id}", settings.CLEANUP_RATE_PORTFOLIO, settings.CLEANUP_BURST_PORTFOLIO)
    ]


def global_buckets() -> list[BucketConfig]:
    if settings.CLEANUP_RATE_GLOBAL <= 0:
        return []
    return [BucketConfig("global", settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL)]


def buckets_for(portfolio_id: int) -> list[BucketConfig]:
    return portfolio_buckets(portfolio_id) + global_buckets()


def docstore_buckets_for(portfolio_id: int) -> list[BucketConfig]:
    """The document store's own buckets (requests per second), apart from the
    delete buckets: purges never spend the database side's tokens, nor the
    other way round."""
    buckets = []
    if settings.DOCSTORE_RATE_PORTFOLIO > 0:
        rate, burst = settings.DOCSTORE_RATE_PORTFOLIO, settings.DOCSTORE_BURST_PORTFOLIO
        buckets.append(BucketConfig(f"docstore:portfolio:{portfolio_id}", rate, burst))
    if settings.DOCSTORE_RATE_GLOBAL > 0:
        buckets.append(BucketConfig("docstore:global", settings.DOCSTORE_RATE_GLOBAL, settings.DOCSTORE_BURST_GLOBAL))
    return buckets


def _take(cur, bucket: BucketConfig, now: float, *, first: bool = True) -> float:
    """Take one token: 0.0 when granted, else seconds until one will be there."""
    sql.execute(
        sql.bucket_take(), [bucket.burst, now, bucket.rate, now, bucket.name, bucket.burst, now, bucket.rate], cur=cur
    )
    if cur.rowcount == 1:
        return 0.0
    row = sql.execute(sql.bucket_read(), [bucket.name], cur=cur).fetchone()
    if row is None and first:
        # First use of this bucket: create it full (a concurrent creator may
        # win; either way the row exists now) and take from it as usual.
        RateBucket.objects.bulk_create(
            [RateBucket(name=bucket.name, tokens=bucket.burst, updated_at=now)], ignore_conflicts=True
        )
        return _take(cur, bucket, now, first=False)
    if row is None:
        raise RuntimeError(f"rate bucket {bucket.name} could not be created")
    tokens, updated_at = row
    available = min(bucket.burst, tokens + max(0.0, now - updated_at) * bucket.rate)
    return max(0.001, (1 - available) / bucket.rate)


def tokens_acquire(*, portfolio_id: int, now: float, buckets: list[BucketConfig] | None = None) -> float:
    """Take a token from the portfolio's bucket and the global one, or from neither.

    Returns 0.0 when granted, else the seconds until a retry could succeed.
    """
    buckets = buckets_for(portfolio_id) if buckets is None else buckets
    if not buckets:
        return 0.0
    with transaction.atomic(), connection.cursor() as cur:
        for bucket in buckets:
            wait = _take(cur, bucket, now)
            if wait > 0:
                transaction.set_rollback(True)
                return wait
    return 0.0


def tokens_give_back(*, portfolio_ids: set[int], include_global: bool = False) -> None:
    """Return the portfolio tokens a transaction took but did not use (the
    portfolios of partitions it left for the next one): a token pays for the
    batches of its own portfolio only. ``include_global``: the transaction
    touched no portfolio at all (or raised), so its global token goes back too."""
    buckets = [bucket for portfolio_id in sorted(portfolio_ids) for bucket in portfolio_buckets(portfolio_id)]
    if include_global:
        buckets += global_buckets()
    if not buckets:
        return
    with transaction.atomic(), connection.cursor() as cur:
        for bucket in buckets:
            sql.execute(sql.bucket_give_back(), [bucket.burst, bucket.name], cur=cur)


# The store's own Retry-After, shared by every worker: one 429 or 503 holds
# all purges until the instant it names, so the other workers defer their jobs
# (no attempt burned) instead of each collecting a 429 of its own. Kept as a
# bucket row whose ``updated_at`` is the instant; it only ever moves later.
DOCSTORE_HOLD = "docstore:retry-after"


def docstore_hold_until(*, until: float) -> None:
    with transaction.atomic():
        RateBucket.objects.bulk_create(
            [RateBucket(name=DOCSTORE_HOLD, tokens=0.0, updated_at=until)], ignore_conflicts=True
        )
        RateBucket.objects.filter(name=DOCSTORE_HOLD, updated_at__lt=until).update(updated_at=until)


def docstore_hold_remaining(*, now: float) -> float:
    """Seconds until the store's last Retry-After instant; 0 when none is pending."""
    until = RateBucket.objects.filter(name=DOCSTORE_HOLD).values_list("updated_at", flat=True).first()
    return max(0.0, until - now) if until is not None else 0.0
